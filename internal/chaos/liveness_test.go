package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Hand-built histories for the liveness oracle, on oracle_test.go's lock
// name "n" (keys n/a on lease 0xa, n/b on 0xb, ...), each event dated by
// second s after a fixed origin. The waiter under test is n/b's, with
// the bound 1.95 s (LivenessBound for loopback round trips).

var origin = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func sec(s float64) time.Time { return origin.Add(time.Duration(s * float64(time.Second))) }

// dated dates each event by the second given for its revision.
func dated(at map[int64]float64, evs ...LockEvent) []LockEvent {
	for i := range evs {
		evs[i].At = sec(at[evs[i].Rev])
	}
	return evs
}

// record is a put of name n's lock-delay record.
func record(rev int64, value string, leaseID int64) LockEvent {
	return LockEvent{Rev: rev, Key: lease.DelayRecordKey("n"), Create: rev, Lease: leaseID, Value: value}
}

func recordGone(rev int64) LockEvent { return del(rev, lease.DelayRecordKey("n")) }

// waitB is a Lock of n by client 2 on lease 0xb, called at second 0.9.
func waitB(ret float64, token int64, err string) Wait {
	w := Wait{Client: 2, Op: "Lock", Name: "n", Lease: 0xb, Mode: lease.Write, Call: sec(0.9), Token: token, Err: err}
	if ret > 0 {
		w.Return = sec(ret)
	}
	return w
}

func params(end float64) Liveness {
	return Liveness{Bound: LivenessBound(0), SessionSlack: time.Second, End: sec(end)}
}

func TestLivenessBound(t *testing.T) {
	if b := LivenessBound(0); b != 1950*time.Millisecond {
		t.Fatalf("LivenessBound(0) = %v, want 1.95s", b)
	}
	if b := LivenessBound(200 * time.Millisecond); b != 3300*time.Millisecond {
		t.Fatalf("LivenessBound(200ms) = %v, want 3.3s", b)
	}
}

func TestCheckWaits(t *testing.T) {
	// n/a holds from 5; n/b queues at 10 (second 1); n/a goes at 12
	// (second 2): n/b's turn, due by second 3.95.
	handoff := func(gone LockEvent) LockHistory {
		return hist(30, dated(map[int64]float64{5: 0.1, 10: 1, 12: 2, 13: 2.1},
			put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), gone)...)
	}
	deleted, moved := handoff(del(12, "n/a")), handoff(put(12, "n/a", 5, 0))
	// With a lock delay: n/a's holding recorded "held 5" at 6; n/a goes at
	// 12 by a loss (no "released"); n/b records "lost 5" at 13, and etcd
	// revokes the record's lease at 20 (second 3.6).
	delayed := func(evs ...LockEvent) LockHistory {
		base := []LockEvent{put(5, "n/a", 5, 0xa), record(6, "held 5", 0), put(10, "n/b", 10, 0xb), del(12, "n/a")}
		return hist(30, dated(map[int64]float64{5: 0.1, 6: 0.2, 10: 1, 12: 2, 13: 2.1, 20: 3.6, 21: 3.7},
			append(base, evs...)...)...)
	}
	withDelay := func(p Liveness) Liveness { p.DelayTTL = time.Second; return p }
	cases := []struct {
		name    string
		h       LockHistory
		w       Wait
		p       Liveness
		checked int
		why     string // in the stuck report; "" if none
	}{
		{"granted in time", deleted, waitB(2.1, 10, ""), params(10), 1, ""},
		{"granted just before the deadline", deleted, waitB(3.85, 10, ""), params(10), 1, ""},
		{"granted after the deadline", deleted, waitB(4.2, 10, ""), params(10), 1, "granted at 12:00:04.200"},
		{"never granted after its turn", deleted, waitB(0, 0, ""), params(10), 1,
			"client 2 Lock of \"n\", key n/b token 10 (lease b), called at 12:00:00.900, behind n/a (token 5, writer) deleted at 12; its turn came at revision 12 (12:00:02.000)"},
		{"timed out after its turn", deleted, waitB(5.9, 0, "context deadline exceeded"), params(10), 1, "returned at 12:00:05.900: context deadline exceeded"},
		{"still waiting, the run ended before its deadline", deleted, waitB(0, 0, ""), params(3.5), 0, ""},
		{"returned before its turn", deleted, waitB(1.5, 0, "context deadline exceeded"), params(10), 0, ""},
		{"its turn never came", hist(30, dated(map[int64]float64{5: 0.1, 10: 1}, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb))...),
			waitB(0, 0, ""), params(10), 0, ""},
		{"its key went before its turn", hist(30, dated(map[int64]float64{5: 0.1, 10: 1, 11: 1.5, 12: 2},
			put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(11, "n/b"), del(12, "n/a"))...),
			waitB(0, 0, ""), params(10), 0, ""},
		// A key moved off its lease is no lock: the turn is at that put.
		{"behind a key moved off its lease, granted in time", moved, waitB(3.8, 10, ""), params(10), 1, ""},
		{"behind a key moved off its lease, stuck", moved, waitB(0, 0, ""), params(10), 1,
			"behind n/a (token 5, writer) moved to lease 0 at 12; its turn came at revision 12"},
		// A reader behind a reader has its turn at its put.
		{"reader behind a reader, never granted", hist(30, dated(map[int64]float64{5: 0.1, 10: 1}, rput(5, "n/a", 5, 0xa), rput(10, "n/b", 10, 0xb))...),
			Wait{Client: 2, Op: "RLock", Name: "n", Lease: 0xb, Mode: lease.Read, Call: sec(0.9)}, params(10), 1,
			"no key ahead; its turn came at revision 10 (12:00:01.000)"},
		// The faults healed later than the turn: the deadline counts from the heal.
		{"healed after the turn", deleted, waitB(6.5, 10, ""), func() Liveness { p := params(10); p.Healed = sec(5); return p }(), 1, ""},
		{"its own client healed after the turn", deleted, waitB(6.5, 10, ""),
			func() Liveness { p := params(10); p.ClientHealed = map[int]time.Time{2: sec(5)}; return p }(), 1, ""},
		{"another client healed after the turn", deleted, waitB(6.5, 10, ""),
			func() Liveness { p := params(10); p.ClientHealed = map[int]time.Time{3: sec(5)}; return p }(), 1, "granted at 12:00:06.500"},
		{"its session lost: a TTL more", deleted, func() Wait { w := waitB(4.5, 0, "session lost"); w.SessionLost = true; return w }(), params(10), 1, ""},
		// Lock delay: the turn waits for the lost record's lease to go
		// (second 3.6), so the deadline is second 5.5.
		{"lock delay respected", delayed(record(13, "lost 5", 0x77), recordGone(20), record(21, "held 10", 0)),
			waitB(5.0, 10, ""), withDelay(params(10)), 1, ""},
		{"lock delay over, stuck", delayed(record(13, "lost 5", 0x77), recordGone(20)),
			waitB(0, 0, ""), withDelay(params(10)), 1, "its lock delay over at 12:00:03.600"},
		{"lock delay still running at the end", delayed(record(13, "lost 5", 0x77)), waitB(0, 0, ""), withDelay(params(10)), 0, ""},
		// Never recorded: the delay would have ended 1 s (its lease) and
		// 0.5 s (etcd's revoke batch) after the turn, at second 3.5.
		{"loss never recorded, stuck", delayed(), waitB(0, 0, ""), withDelay(params(10)), 1, "its lock delay over at 12:00:03.500"},
		{"loss never recorded, not yet due", delayed(), waitB(0, 0, ""), withDelay(params(5)), 0, ""},
		// A clean release records "released" with the delete: no delay.
		{"after a release no delay", hist(30, dated(map[int64]float64{5: 0.1, 6: 0.2, 10: 1, 12: 2},
			put(5, "n/a", 5, 0xa), record(6, "held 5", 0), put(10, "n/b", 10, 0xb), del(12, "n/a"), record(12, "released 5", 0))...),
			waitB(5.0, 10, ""), withDelay(params(10)), 1, "granted at 12:00:05.000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := CheckWaits(c.h, []Wait{c.w}, c.p)
			if res.Lost != nil {
				t.Fatalf("inconclusive: %v", res.Lost)
			}
			if res.Checked != c.checked {
				t.Errorf("checked %d waiters, want %d", res.Checked, c.checked)
			}
			switch {
			case c.why == "" && len(res.Stuck) > 0:
				t.Fatalf("a waiter in time reported stuck: %s", res.Stuck[0])
			case c.why != "" && len(res.Stuck) != 1:
				t.Fatalf("%d stuck waiters, want 1 saying %q", len(res.Stuck), c.why)
			case c.why != "" && !strings.Contains(res.Stuck[0], c.why):
				t.Fatalf("report %q, want one saying %q", res.Stuck[0], c.why)
			}
		})
	}
}

// A session's calls of a name fall to its key's incarnations in order: a
// refused try put nothing (its After is before the next put), an
// abandoned call's key went before its turn, and the call after them is
// the stuck one. A call whose After could not be read leaves the calls
// after it unplaced: inconclusive, never passed.
func TestCheckWaitsPlacesCalls(t *testing.T) {
	h := hist(30, dated(map[int64]float64{5: 0.1, 7: 0.3, 8: 0.5, 10: 1, 12: 2},
		put(5, "n/a", 5, 0xa), put(7, "n/b", 7, 0xb), del(8, "n/b"), put(10, "n/b", 10, 0xb), del(12, "n/a"))...)
	try := Wait{Client: 2, Op: "TryLock", Name: "n", Lease: 0xb, Call: sec(0.05), Return: sec(0.08), Err: "locked", After: 6}
	abandoned := Wait{Client: 2, Op: "Lock", Name: "n", Lease: 0xb, Call: sec(0.2), Return: sec(0.6), Err: "context deadline exceeded", After: 9}
	stuck := waitB(0, 0, "")
	res := CheckWaits(h, []Wait{stuck, abandoned, try}, params(10))
	if res.Lost != nil || res.Checked != 1 || len(res.Stuck) != 1 || !strings.Contains(res.Stuck[0], "token 10") {
		t.Fatalf("lost=%v checked=%d stuck=%q; want the call at 0.9 s stuck with token 10", res.Lost, res.Checked, res.Stuck)
	}
	abandoned.After = 0
	res = CheckWaits(h, []Wait{try, abandoned, stuck}, params(10))
	if !errors.Is(res.Lost, ErrLivenessInconclusive) || res.Unproven != 2 || len(res.Stuck) != 0 {
		t.Fatalf("lost=%v unproven=%d stuck=%q; want the last two calls unplaced, inconclusive", res.Lost, res.Unproven, res.Stuck)
	}
}

// Scenario 13: handoffs the liveness oracle watches. A holder holds;
// three waiters queue behind it, one after another, each once the one
// before has started waiting; the holder lets go, and each waiter, once
// granted, lets go at once. Each must be granted within the bound of its
// turn. Under DroppedWake a watch's news of the key ahead going does not
// wake a waiter: it sleeps until its own context ends, past its
// deadline, and the oracle must say so (TestMutantsAreCaught). A waiter
// still setting up its wait (its own-key watch, a read) as its turn
// comes sees the deletion without a wake-up; the ones behind it have
// long been asleep when theirs comes.
func scenarioLivenessHandoff(t testing.TB, ctx context.Context) error {
	const waiters = 3
	cli := etcd.Client(t)
	prefix := etcdproc.Name(t, "liveness") + "/"
	o, err := StartOracle(ctx, cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	name := prefix + "lock"
	bound := LivenessBound(0)
	holder := timedLock(ctx, o, 0, session(t, ctx, cli, 5*time.Second), name, bound)
	if holder == nil {
		t.Fatal("the holder's Lock failed")
	}
	done := make(chan struct{}, waiters)
	for i := 1; i <= waiters; i++ {
		waiting := make(chan struct{}, 1)
		hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
			if delta > 0 {
				select { // a hook must not block the library
				case waiting <- struct{}{}:
				default:
				}
			}
		}}
		s, err := newSession(ctx, cli, lease.WithTTL(5*time.Second), lease.WithHooks(hooks))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		go func() {
			defer func() { done <- struct{}{} }()
			// Room past the bound: a waiter that sleeps past its turn is
			// still waiting when its deadline passes.
			if l := timedLock(ctx, o, i, s, name, bound+3*time.Second); l != nil {
				l.Unlock(ctx)
			}
		}()
		select {
		case <-waiting:
		case <-ctx.Done():
			t.Fatalf("waiter %d never started waiting", i)
		}
	}
	holder.Unlock(ctx)
	for range waiters {
		<-done
	}
	end := time.Now()
	if res := o.Finish(ctx); res.Lost != nil || len(res.Invalid) > 0 {
		t.Fatalf("lock oracle: lost=%v invalid=%q", res.Lost, res.Invalid)
	}
	lv := o.Liveness(Liveness{Bound: bound, SessionSlack: 5 * time.Second, End: end})
	switch {
	case lv.Lost != nil:
		t.Fatalf("liveness oracle inconclusive: %v", lv.Lost)
	case len(lv.Stuck) > 0:
		return fmt.Errorf("%d stuck waiters, the first: %s", len(lv.Stuck), lv.Stuck[0])
	case lv.Checked != 1+waiters:
		t.Fatalf("the liveness oracle checked %d waiters, want %d (the holder and the waiters)", lv.Checked, 1+waiters)
	}
	return nil
}

// timedLock takes name on s within d, telling o of the call as a chaos
// client does; nil if it failed.
func timedLock(ctx context.Context, o *Oracle, client int, s *lease.Session, name string, d time.Duration) *lease.Lock {
	lctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	w := Wait{Client: client, Op: "Lock", Name: name, Lease: int64(s.Lease()), Mode: lease.Write, Call: time.Now()}
	l, err := s.Lock(lctx, name)
	w.Return = time.Now()
	if err != nil {
		w.Err, w.SessionLost = err.Error(), s.Err() != nil
		o.Waited(ctx, w)
		return nil
	}
	o.Granted(client, s, l)
	w.Token = l.Token()
	o.Waited(ctx, w)
	return l
}

func TestScenario13LivenessHandoff(t *testing.T) {
	for range repeat(t, 2, 10) {
		if err := scenarioLivenessHandoff(t, plain(t)); err != nil {
			t.Fatal(err)
		}
	}
}
