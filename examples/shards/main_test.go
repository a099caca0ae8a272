package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) {
	if os.Getenv(exampleenv.ChildEnv) == childRole {
		if err := workerMain(os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, os.Getenv(envID)+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// No fsync: the story writes every shard every period, and what it
	// checks is the order of commits, which fsync does not change.
	os.Exit(etcd.Main(m, etcdproc.Config{NoFsync: true}))
}

// The story against a real etcd process, with the workers as processes:
// one paused past its lease and resumed, one killed, one added. After each
// change every shard is owned again within the bound the package doc
// states; the resumed worker's writes are refused, naming a higher token;
// and etcd's history shows no shard taking a write from an old owner.
func TestShards(t *testing.T) {
	cfg := config{workers: 4, shards: 256, ttl: 2 * time.Second, period: 500 * time.Millisecond}
	var out bytes.Buffer
	rep, err := run(strings.Join(etcd.Endpoints(), ","), cfg, &out)
	t.Log("\n" + out.String())
	for id, e := range rep.exits {
		if e != nil || strings.Contains(rep.stderr[id], "DATA RACE") {
			t.Errorf("%s exited with %v; its stderr:\n%s", id, e, rep.stderr[id])
		}
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	loss, join := lossBound(cfg.ttl, cfg.period), joinBound(cfg.period)
	// The bounds count a pass's requests as idle etcd answers them. This
	// test runs under -race, five processes beside etcd on a small machine
	// that other tests share, where one pass taking 64 shards has been
	// seen to need 1.6 s: allow that much more.
	const loaded = 2 * time.Second
	for _, c := range []struct {
		what        string
		took, bound time.Duration
	}{
		{"a pause past the lease", rep.pause, loss},
		{"the resumed worker's return", rep.resume, join},
		{"a kill", rep.kill, loss},
		{"a new worker", rep.add, join},
	} {
		t.Logf("after %s: settled in %v (bound %v)", c.what, c.took.Round(time.Millisecond), c.bound)
		if c.took <= 0 || c.took > c.bound+loaded {
			t.Errorf("after %s the shards took %v to settle, bound %v (+%v for load)", c.what, c.took, c.bound, loaded)
		}
	}
	// The resumed worker held about a quarter of the shards, and wrote
	// to each with its old token once it ran again.
	if len(rep.refused) == 0 {
		t.Fatal("no write of the resumed worker was refused")
	}
	for _, r := range rep.refused {
		if r.highest <= r.token || !strings.Contains(r.msg, "stale token") {
			t.Errorf("shard %d: refusal of token %d names highest %d: %q", r.shard, r.token, r.highest, r.msg)
		}
	}
	a := rep.audit
	if a.writes < cfg.shards || a.handoffs < cfg.shards/cfg.workers {
		t.Errorf("history has %d writes and %d handoffs: too few for the story", a.writes, a.handoffs)
	}
	// A write landing after its lock key was gone is not unsafe (no later
	// owner had claimed the shard), but none is expected here: a worker
	// releases a shard only after its writes, and a paused one's writes
	// are all refused.
	t.Logf("%d writes after their lock key was gone", a.late)

	// The control: the checker must catch an old owner's write made
	// without the fence, as an unfenced worker would make it on resuming.
	r := rep.refused[0]
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	forged := datum{writer: "w1", token: r.token, count: 1}
	if _, err := cli.Put(ctx, rep.keys.dataKey(r.shard), forged.String()); err != nil {
		t.Fatal(err)
	}
	h, err := readHistory(ctx, cli, rep.keys, rep.from)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(rep.keys, cfg.shards, h).err(); err == nil || !strings.Contains(err.Error(), "but the fence record held") {
		t.Fatalf("the history with an unfenced stale write passed the check: %v", err)
	}
}

func TestWorkerFromEnv(t *testing.T) {
	env := map[string]string{envID: "w1", envPrefix: "p", envShards: "16", envTTL: "2s", envPeriod: "1s",
		envEndpoints: "http://a:2379,http://b:2379"}
	cfg, eps, err := workerFromEnv(func(k string) string { return env[k] })
	if err != nil || cfg.shards != 16 || cfg.ttl != 2*time.Second || cfg.period != time.Second || len(eps) != 2 {
		t.Fatalf("got %+v %v %v", cfg, eps, err)
	}
	env[envShards], env[envPeriod], env[envID] = "0", "0s", ""
	if _, _, err := workerFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Fatal("a bad environment was taken")
	}
}
