package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// The holder's flags in the mixed rounds: a command that ignores SIGTERM
// lives on until SIGKILL, 6s after it; the holding asks its successors
// for 2s + 6s + 1s. The waiter's flags are the shortest: its own delay is
// 2s + 1s + 1s, which alone would start its command while the holder's
// still runs.
var (
	mixedHolder = []string{"run", "-ttl", "2s", "-kill-after", "6s"}
	mixedWaiter = []string{"run", "-ttl", "2s", "-kill-after", "1s"}
)

// mixedRounds is how many rounds TestRunMixedDelays runs (half revoked,
// half cut off), two at a time.
const mixedRounds = 20

// TestRunMixedDelays: runs on one name with different -ttl and
// -kill-after. The holder, whose command ignores SIGTERM, is lost by a
// revoke or a cut link; the waiter, with the shortest settings, starts
// its command only after the holder's command has stopped, in every
// round, because it waits out the delay the holder's holding asked. It
// says on stderr behind whom it waited and that it waited out a delay.
func TestRunMixedDelays(t *testing.T) {
	rounds := mixedRounds
	if testing.Short() {
		rounds = 4
	}
	cli := etcd.Client(t)
	var mu sync.Mutex
	var termLag, startGap []time.Duration
	t.Run("rounds", func(t *testing.T) {
		for i := range rounds {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				lag, gap := mixedRound(t, cli, i, i%2 == 1)
				mu.Lock()
				termLag, startGap = append(termLag, lag), append(startGap, gap)
				mu.Unlock()
			})
		}
	})
	t.Logf("loss to SIGTERM (revoke: after; cut: negative is before etcd's expiry) %s", spread(termLag))
	t.Logf("the holder's command's last sign of life to the next command's start %s", spread(startGap))
}

// mixedRound runs one round; cut: the holder's link to etcd is cut
// instead of its lease revoked. It returns the time from the loss (the
// revoke, or etcd's expiry) to SIGTERM, and from the holder's command's
// last sign of life to the waiter's command's start.
func mixedRound(t *testing.T, cli *clientv3.Client, i int, cut bool) (lag, gap time.Duration) {
	sc := startLossScene(t, cli, etcdproc.Name(t, fmt.Sprintf("mixed%d", i)), cut, mixedHolder, mixedWaiter, "ignore")
	lossAt, deletedAt := sc.lose(t, cli)
	if cut {
		lossAt = deletedAt // etcd's expiry: when the waiter can learn of it
	}
	if i == 0 {
		checkShowsDelay(t, sc.name, sc.h.Token)
	}
	nextStart, term, last := sc.finish(t)
	out := sc.next.stderr.String()
	behind := fmt.Sprintf("lockctl: run %s: waiting behind %s (owner ", sc.name, sc.h.Key)
	delay := regexp.MustCompile(fmt.Sprintf(`lockctl: run %s: the holder with token %d lost the lock; waiting out the lock delay, about (\d+)s left`,
		regexp.QuoteMeta(sc.name), sc.h.Token))
	if !strings.Contains(out, behind) || !strings.Contains(out, fmt.Sprintf("token %d), 1 ahead\n", sc.h.Token)) || !delay.MatchString(out) {
		t.Errorf("round %d: the waiter's stderr %q lacks the line saying behind whom it waited, or the one saying it waited out a delay", i, out)
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("round %d: the waiter printed %d lines, want 2: %q", i, n, out)
	}
	t.Logf("round %d (cut %v): SIGTERM %v after the loss; next started %v after the first's last sign of life",
		i, cut, term.Sub(lossAt), nextStart.Sub(last))
	return term.Sub(lossAt), nextStart.Sub(last)
}

// checkShowsDelay checks that show and list mark the holder of name that
// waits out the delay after token lost's loss.
func checkShowsDelay(t *testing.T, name string, lost int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := lockctl(t, "show", name)
		if err == nil && strings.Contains(out, "\ndelaying ") &&
			strings.Contains(out, fmt.Sprintf("%s: the lock delay after the loss of token %d has about ", name, lost)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("show never marked the holder waiting out the delay: %q %v", out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, err := lockctl(t, "list", name)
	if err != nil || !strings.Contains(out, "DELAY") || !strings.Contains(out, fmt.Sprintf("(lost %d)", lost)) {
		t.Errorf("list does not mark the holder waiting out the delay: %q %v", out, err)
	}
}

// A run whose name's record names a holding whose session ended longer
// ago than its delay does not wait: the record has lapsed. Between the
// two runs a Go job without a lock delay held and released the name.
func TestRunStaleRecordDoesNotDelay(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "stale")
	first := startLockctl(t, nil, append(append([]string{}, lossFlags...), name, "--", "sh", "-c", `echo up > "$0"; exec sleep 30`, filepath.Join(t.TempDir(), "up"))...)
	h := awaitHolder(t, cli, name, 0)
	_ = first
	gone := cli.Watch(context.Background(), lease.DelayRecordKey(name), clientv3.WithFilterPut())
	if _, err := cli.Revoke(context.Background(), h.Lease); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(t, 20*time.Second); code != exitLost {
		t.Fatalf("the holder: exit %d, want %d", code, exitLost)
	}
	select {
	case <-gone: // the record lapsed with the lost session's delay lease
	case <-time.After(20 * time.Second):
		t.Fatal("the lost holding's delay record never lapsed")
	}
	s := session(t, cli)
	l, err := s.Lock(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	next := startLockctl(t, nil, "run", "-lock-delay", "20s", name, "--", "true")
	if code := next.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("next run: exit %d", code)
	}
	if took := time.Since(start); took > 3*time.Second || strings.Contains(next.stderr.String(), "lock delay") {
		t.Errorf("a run after a stale record took %v, stderr %q: it waited out a delay", took, next.stderr.String())
	}
}

// -q prints nothing while waiting; -v adds the grant, the start and the
// release.
func TestRunQuietAndVerbose(t *testing.T) {
	cli := etcd.Client(t)
	for _, c := range []struct {
		flag string
		want []string
	}{
		{"-q", nil},
		{"-v", []string{"waiting behind ", "granted, token ", "started true, pid ", "true exited 0; released the lock"}},
	} {
		t.Run(c.flag, func(t *testing.T) {
			name := etcdproc.Name(t, "narrate")
			l, err := session(t, cli).Lock(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			p := startLockctl(t, nil, "run", c.flag, name, "--", "true")
			awaitQueue(t, cli, name, 2)
			if err := l.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			out := p.stderr.String()
			if n := strings.Count(out, "\n"); n != len(c.want) {
				t.Errorf("%s printed %d lines, want %d: %q", c.flag, n, len(c.want), out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, "lockctl: run "+name+": "+w) {
					t.Errorf("%s: stderr %q lacks %q", c.flag, out, w)
				}
			}
		})
	}
}
