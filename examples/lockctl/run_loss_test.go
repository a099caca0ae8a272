package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// The holder's command in the loss rounds: a timestamp every 20 ms (its
// last shows when it stopped), "term" and its time when SIGTERM comes, and
// with $1 = ignore, SIGTERM ignored, so that only SIGKILL ends it.
const heartbeat = `
if [ "$1" = ignore ]; then
	trap 'echo "term $(date +%s%N)" >> "$0"' TERM
else
	trap 'echo "term $(date +%s%N)" >> "$0"; sleep 0.1; date +%s%N >> "$0"; exit 0' TERM
fi
while :; do date +%s%N >> "$0"; sleep 0.02; done`

// lossFlags give etcd's shortest lease and the shortest lock delay that
// covers it and the kill grace.
var lossFlags = []string{"run", "-ttl", "2s", "-kill-after", "1s", "-lock-delay", "4s"}

// TestRunLoss: a holder's lease revoked, or its link to etcd cut, while
// its command runs. The command gets SIGTERM (SIGKILL when it ignores
// it) before etcd expires the lease, lockctl exits 124, and the next
// holder's command starts only after the first command's last sign of
// life.
func TestRunLoss(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 4
	}
	cli := etcd.Client(t)
	var termLag []time.Duration
	var beforeExpiry []time.Duration
	for i := range rounds {
		cut, ignore := i%2 == 1, i%4 >= 2
		lag, ahead := lossRound(t, cli, i, cut, ignore)
		if cut {
			beforeExpiry = append(beforeExpiry, ahead)
		} else {
			termLag = append(termLag, lag)
		}
	}
	t.Logf("revoked: revoke to SIGTERM %s", spread(termLag))
	t.Logf("cut off: SIGTERM ahead of etcd's expiry %s", spread(beforeExpiry))
}

// spread is min, median and max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "(none)"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("min %v median %v max %v over %d rounds", ds[0], ds[len(ds)/2], ds[len(ds)-1], len(ds))
}

// lossScene is one round of a holder losing its lock to a run queued
// behind it: the holder's command writes its heartbeats to beats, the
// next one the time it started to started.
type lossScene struct {
	name, beats, started string
	first, next          *proc
	h                    lease.QueueEntry
	px                   interface {
		BlackholeTx()
		BlackholeRx()
		UnblackholeTx()
		UnblackholeRx()
	}
}

// startLossScene starts the holder (through a proxy that can cut it off,
// if cut) with holderArgs and a heartbeat command in mode ("handle" or
// "ignore" SIGTERM), then the next run with nextArgs, queued behind it.
func startLossScene(t *testing.T, cli *clientv3.Client, name string, cut bool, holderArgs, nextArgs []string, mode string) *lossScene {
	t.Helper()
	dir := t.TempDir()
	sc := &lossScene{name: name, beats: filepath.Join(dir, "beats"), started: filepath.Join(dir, "started")}
	eps := etcd.Endpoints()
	if cut {
		p, url := etcdproc.ProxyT(t, eps[0])
		sc.px, eps = p, []string{url}
	}
	sc.first = startLockctl(t, eps, append(slices.Clone(holderArgs), name, "--", "sh", "-c", heartbeat, sc.beats, mode)...)
	sc.first.awaitFile(t, sc.beats)
	sc.h = awaitHolder(t, cli, name, 0)
	sc.next = startLockctl(t, nil, append(slices.Clone(nextArgs), name, "--", "sh", "-c", `date +%s%N > "$0"`, sc.started)...)
	awaitQueue(t, cli, name, 2)
	return sc
}

// lose cuts the holder off (or revokes its lease) and returns when it did
// and when etcd deleted the holder's key.
func (sc *lossScene) lose(t *testing.T, cli *clientv3.Client) (lossAt, deletedAt time.Time) {
	t.Helper()
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	deletes := cli.Watch(wctx, sc.h.Key, clientv3.WithFilterPut(), clientv3.WithRev(sc.h.Token))
	lossAt = time.Now()
	if sc.px != nil {
		sc.px.BlackholeTx()
		sc.px.BlackholeRx()
	} else if _, err := cli.Revoke(context.Background(), sc.h.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case <-deletes:
		return lossAt, time.Now()
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the holder's key was not deleted", sc.name)
	}
	return
}

// finish waits for the next command's start and both runs' exits (the
// holder's with exitLost), and returns the next start and the holder's
// command's SIGTERM and last sign of life, checking that it stopped
// before the next one started.
func (sc *lossScene) finish(t *testing.T) (nextStart, term, last time.Time) {
	t.Helper()
	nextStart = parseNanos(t, awaitFile(t, sc.started, 40*time.Second))
	if sc.px != nil {
		sc.px.UnblackholeTx()
		sc.px.UnblackholeRx()
	}
	if code := sc.first.wait(t, 30*time.Second); code != exitLost {
		t.Fatalf("%s: holder exit %d, want %d", sc.name, code, exitLost)
	}
	if code := sc.next.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("%s: next exit %d", sc.name, code)
	}
	term, last = readBeats(t, sc.beats)
	if term.IsZero() {
		t.Fatalf("%s: the command got no SIGTERM", sc.name)
	}
	if !last.Before(nextStart) {
		t.Fatalf("%s: the next command started at %v, %v before the first stopped at %v",
			sc.name, nextStart, last.Sub(nextStart), last)
	}
	return nextStart, term, last
}

// lossRound runs one round. It returns, for a revoke, the time from the
// revoke to SIGTERM, and for a cut, how long before etcd expired the
// lease the command got SIGTERM.
func lossRound(t *testing.T, cli *clientv3.Client, i int, cut, ignore bool) (lag, ahead time.Duration) {
	t.Helper()
	mode := "handle"
	if ignore {
		mode = "ignore"
	}
	sc := startLossScene(t, cli, etcdproc.Name(t, fmt.Sprintf("job%d", i)), cut, lossFlags, lossFlags, mode)
	lossAt, expiredAt := sc.lose(t, cli)
	nextStart, term, last := sc.finish(t)
	// A command that ignores SIGTERM lives on until SIGKILL, -kill-after
	// (1s) later; one that handles it stops within its 0.1s of cleanup.
	if stopped := last.Sub(term); ignore != (stopped > 500*time.Millisecond) {
		t.Fatalf("round %d (ignores TERM %v): last sign of life %v after SIGTERM", i, ignore, stopped)
	}
	if cut && !term.Before(expiredAt) {
		t.Fatalf("round %d: SIGTERM at %v, after etcd expired the lease at %v", i, term, expiredAt)
	}
	t.Logf("round %d (cut %v, ignores TERM %v): SIGTERM %v after the loss, %v before expiry; next started %v after the first stopped",
		i, cut, ignore, term.Sub(lossAt), expiredAt.Sub(term), nextStart.Sub(last))
	return term.Sub(lossAt), expiredAt.Sub(term)
}

// awaitQueue waits until name's queue has n entries.
func awaitQueue(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		q, err := lease.Inspect(context.Background(), cli, name)
		if err == nil && len(q) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: %v %v, want %d entries", name, q, err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func parseNanos(t *testing.T, s string) time.Time {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatalf("timestamp %q: %v", s, err)
	}
	return time.Unix(0, n)
}

// readBeats reads the holder's command's file: when it got SIGTERM, and
// its last sign of life.
func readBeats(t *testing.T, path string) (term, last time.Time) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if rest, ok := strings.CutPrefix(line, "term "); ok {
			if term.IsZero() {
				term = parseNanos(t, rest)
			}
			line = rest
		}
		if at := parseNanos(t, line); at.After(last) {
			last = at
		}
	}
	return term, last
}

// TestRunLossBeforeStart: a loss while run waits out the lock delay,
// after the grant and before the command starts, exits 124 as a loss
// while the command runs does, with the same message up to what became
// of the command.
func TestRunLossBeforeStart(t *testing.T) {
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := etcdproc.Name(t, "job")
	dir := t.TempDir()
	marker, up := filepath.Join(dir, "ran"), filepath.Join(dir, "up")
	// The holder takes the lock with a delay too, so that its loss is
	// waited out.
	hs := session(t, cli, lease.WithLockDelay(4*time.Second))
	held, err := hs.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// -q: only the loss's message, which the two cases must share.
	p := startLockctl(t, nil, append(slices.Clone(lossFlags), "-q", name, "--", "touch", marker)...)
	awaitQueue(t, cli, name, 2)
	if _, err := cli.Revoke(ctx, hs.Lease()); err != nil {
		t.Fatal(err)
	}
	// run's key heads the queue now, and run waits out the 4s delay
	// before it starts its command: delete the key meanwhile.
	h := awaitHolder(t, cli, name, held.Token())
	if _, err := cli.Delete(ctx, h.Key); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != exitLost {
		t.Fatalf("a loss before the start: exit %d, want %d", code, exitLost)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran after the loss")
	}
	before := p.stderr.String()

	// The same loss while the command runs.
	p = startLockctl(t, nil, append(slices.Clone(lossFlags), "-q", name, "--", "sh", "-c", `echo up > "$0"; exec sleep 30`, up)...)
	p.awaitFile(t, up)
	h = awaitHolder(t, cli, name, h.Token)
	if _, err := cli.Delete(ctx, h.Key); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != exitLost {
		t.Fatalf("a loss after the start: exit %d, want %d", code, exitLost)
	}
	after := p.stderr.String()
	same := "lockctl: run " + name + ": lost the lock (lease: lock lost: lock key deleted or replaced); "
	if before != same+"touch did not run\n" || after != same+"stopped sh\n" {
		t.Fatalf("stderr before the start %q, after %q; want both to start %q", before, after, same)
	}
}
