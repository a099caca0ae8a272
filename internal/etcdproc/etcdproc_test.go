package etcdproc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// The member serves, and the proxy in front of it delays, cuts and
// restores the link on command.
func TestMemberAndProxy(t *testing.T) {
	etcdproc.LeakCheck(t)
	c := etcdproc.StartT(t, etcdproc.Config{NoFsync: true})
	cli := c.ClientT(t)
	if _, err := cli.Put(etcdproc.Ctx(t, 10*time.Second), "k", "v"); err != nil {
		t.Fatal(err)
	}
	p, via, _ := etcdproc.ProxiedClient(t, c.Endpoints()[0])
	get := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := via.Get(ctx, "k")
		return err
	}
	if err := get(10 * time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.DelayRx(300*time.Millisecond, 0)
	start := time.Now()
	if err := get(10 * time.Second); err != nil {
		t.Fatalf("delayed: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("answer after %v with 300ms of delay", d)
	}
	p.UndelayRx()
	p.BlackholeTx()
	p.BlackholeRx()
	if err := get(time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blackholed: got %v, want the deadline", err)
	}
	p.UnblackholeTx()
	p.UnblackholeRx()
	// A stream that lost bytes in the blackhole may be broken; the client
	// reconnects within its dial timeout.
	deadline := time.Now().Add(20 * time.Second)
	for get(2*time.Second) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no answer 20s after the blackhole was lifted")
		}
	}
}

// TestTakenPortFailsFast: a member whose port another listener holds exits
// at once, and starting it reports that rather than waiting out the
// 30-second readiness timeout, so that callers can retry on new ports.
func TestTakenPortFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin, err := etcdproc.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ports, release, err := etcdproc.HoldPorts(2)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	start := time.Now()
	c, err := etcdproc.StartProcessesWith(ctx, bin, t.TempDir(), []etcdproc.ProcHost{{IP: "127.0.0.1", ClientPort: ports[0], PeerPort: ports[1]}}, nil, etcdproc.NewClient)
	if err == nil {
		c.Close()
		t.Fatal("a member on held ports started")
	}
	if took := time.Since(start); !strings.Contains(err.Error(), "exited before serving") || took > 15*time.Second {
		t.Fatalf("after %v: %v; want an early exit reported", took, err)
	}
}
