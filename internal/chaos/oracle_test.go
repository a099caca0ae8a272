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

// Hand-built histories of one lock name "n": keys n/a (lease 0xa), n/b
// (lease 0xb), ... The grant under test is n/b's unless said otherwise.

func put(rev int64, key string, create, leaseID int64) LockEvent {
	return LockEvent{Rev: rev, Key: key, Create: create, Lease: leaseID}
}

func rput(rev int64, key string, create, leaseID int64) LockEvent {
	e := put(rev, key, create, leaseID)
	e.Reader = true
	return e
}

func del(rev int64, key string) LockEvent { return LockEvent{Rev: rev, Key: key, Delete: true} }

func hist(through int64, evs ...LockEvent) LockHistory {
	return LockHistory{Start: 1, Through: through, Events: evs}
}

func grantB(mode lease.Mode, token, upper int64) Grant {
	return Grant{Name: "n", Key: "n/b", Lease: 0xb, Token: token, Mode: mode, Upper: upper}
}

func TestCheckGrant(t *testing.T) {
	w, r := lease.Write, lease.Read
	cases := []struct {
		name  string
		h     LockHistory
		g     Grant
		valid bool
		why   string // in the error of an invalid grant
	}{
		{"alone, granted at its put", hist(20, put(10, "n/b", 10, 0xb)), grantB(w, 10, 12), true, ""},
		{"after the older key went", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(12, "n/a")),
			grantB(w, 10, 13), true, ""},
		{"while an older key exists", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(12, "n/a")),
			grantB(w, 10, 11), false, "older writer's key n/a (token 5) exists"},
		{"after its own key was deleted", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(11, "n/b"), del(12, "n/a")),
			grantB(w, 10, 13), false, "its own key does not exist"},
		{"own key and older key gone in one revision", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(12, "n/a"), del(12, "n/b")),
			grantB(w, 10, 13), false, "its own key does not exist"},
		{"own key replaced by a newer one", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(11, "n/b"), put(12, "n/b", 12, 0xb), del(13, "n/a")),
			grantB(w, 10, 14), false, "its own key has token 12"},
		{"own key moved to another lease", hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), put(11, "n/b", 10, 0xc), del(12, "n/a")),
			grantB(w, 10, 13), false, "its own key is on lease c"},
		{"reader behind a reader", hist(20, rput(5, "n/a", 5, 0xa), rput(10, "n/b", 10, 0xb)), grantB(r, 10, 10), true, ""},
		{"writer behind a reader", hist(20, rput(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb)),
			grantB(w, 10, 15), false, "older reader's key n/a (token 5) exists"},
		{"reader behind a writer", hist(20, put(5, "n/a", 5, 0xa), rput(10, "n/b", 10, 0xb)),
			grantB(r, 10, 15), false, "older writer's key n/a (token 5) exists"},
		{"reader behind a reader behind a writer", hist(20, put(3, "n/c", 3, 0xc), rput(5, "n/a", 5, 0xa), rput(10, "n/b", 10, 0xb), del(11, "n/c")),
			grantB(r, 10, 11), true, ""},
		{"a newer writer does not block", hist(20, put(10, "n/b", 10, 0xb), put(11, "n/a", 11, 0xa)), grantB(w, 10, 11), true, ""},
		{"keys that are no place in the queue", hist(20, put(2, "n/sub/1", 2, 0x1), put(3, "n/data", 3, 0), put(4, "n/5", 4, 0x6),
			put(5, "nx/a", 5, 0xa), put(10, "n/b", 10, 0xb)), grantB(w, 10, 10), true, ""},
		{"its key never put", hist(20, put(5, "n/a", 5, 0xa)), grantB(w, 10, 12), false, "never put"},
		{"bound before the token", hist(20, put(10, "n/b", 10, 0xb)), grantB(w, 10, 9), false, "before the token"},
		{"key not its session's", hist(20, put(10, "n/b", 10, 0xb)), Grant{Name: "n", Key: "n/b", Lease: 0xc, Token: 10, Upper: 10},
			false, "key is not n/c"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckGrant(c.h, c.g)
			switch {
			case c.valid && err != nil:
				t.Fatalf("valid grant found invalid: %v", err)
			case !c.valid && err == nil:
				t.Fatal("invalid grant passed")
			case !c.valid && (errors.Is(err, ErrInconclusive) || !strings.Contains(err.Error(), c.why)):
				t.Fatalf("error %q, want one saying %q", err, c.why)
			}
		})
	}
}

// A window the history does not cover is inconclusive, never valid.
func TestCheckGrantOutsideHistory(t *testing.T) {
	h := hist(12, put(10, "n/b", 10, 0xb))
	for _, g := range []Grant{grantB(lease.Write, 10, 13), grantB(lease.Write, 1, 5)} {
		if err := CheckGrant(h, g); !errors.Is(err, ErrInconclusive) {
			t.Errorf("%s: %v, want ErrInconclusive", g, err)
		}
	}
}

// The per-run control: a grant that waited, forged as decided at its own
// put, is counted and must be flagged; a reader's and one that did not
// wait are not forged.
func TestOracleResultForgesWaitedGrants(t *testing.T) {
	h := hist(20, put(5, "n/a", 5, 0xa), put(10, "n/b", 10, 0xb), del(12, "n/a"), del(13, "n/b"),
		put(14, "n/c", 14, 0xc), rput(15, "n/d", 15, 0xd))
	var res OracleResult
	res.check(h, grantB(lease.Write, 10, 12))
	res.check(h, Grant{Name: "n", Key: "n/c", Lease: 0xc, Token: 14, Upper: 14})
	res.check(h, Grant{Name: "n", Key: "n/d", Lease: 0xd, Token: 15, Mode: lease.Read, Upper: 15})
	if res.Grants != 3 || len(res.Invalid) != 1 || res.Forged != 1 || res.Flagged != 1 {
		t.Fatalf("grants=%d invalid=%q forged=%d flagged=%d; want 3 grants, 1 invalid (the reader behind n/c), 1 forged and flagged",
			res.Grants, res.Invalid, res.Forged, res.Flagged)
	}
}

// The oracle against etcd: real grants (a writer that waits, readers that
// share, a writer behind them) are all valid, and the same grants with
// their bound forged to their own put are caught where they had to wait.
func TestOracleLive(t *testing.T) {
	ctx := etcdproc.Ctx(t, time.Minute)
	cli := etcd.Client(t)
	prefix := etcdproc.Name(t, "oracle") + "/"
	o, err := StartOracle(ctx, cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	name := prefix + "lock"
	s1, s2, s3 := session(t, ctx, cli, 5*time.Second), session(t, ctx, cli, 5*time.Second), session(t, ctx, cli, 5*time.Second)
	first := lock(t, ctx, s1, name)
	o.Granted(1, s1, first)
	second := lockLater(ctx, s2, name)
	if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
		t.Fatal(err)
	}
	first.Unlock(ctx)
	l2 := <-second
	if l2 == nil {
		t.Fatal("second Lock failed")
	}
	o.Granted(2, s2, l2)
	l2.Unlock(ctx)
	var readers []*lease.Lock
	for i, s := range []*lease.Session{s1, s3} {
		r, err := s.RLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		o.Granted(10+i, s, r)
		readers = append(readers, r)
	}
	writer := lockLater(ctx, s2, name)
	if err := waitQueuedKeys(ctx, cli, name, 3); err != nil {
		t.Fatal(err)
	}
	for _, r := range readers {
		r.Unlock(ctx)
	}
	l3 := <-writer
	if l3 == nil {
		t.Fatal("writer behind the readers failed")
	}
	o.Granted(3, s2, l3)
	l3.Unlock(ctx)

	res := o.Finish(ctx)
	if res.Lost != nil || len(res.Invalid) > 0 || res.Grants != 5 {
		t.Fatalf("lost=%v invalid=%q grants=%d, want 5 valid", res.Lost, res.Invalid, res.Grants)
	}
	// The second grant and the writer behind the readers waited.
	if res.Forged != 2 || res.Flagged != 2 {
		t.Fatalf("forged early grants: %d flagged of %d, want 2 of 2", res.Flagged, res.Forged)
	}
	t.Logf("grants=%d forged=%d flagged=%d", res.Grants, res.Forged, res.Flagged)
}

// Scenario 12: the lock oracle on its own catches a waiter granted after
// its key was deleted. A holder holds; a waiter queues behind it; the
// waiter's key is deleted, then the holder lets go. The library must not
// grant the waiter (scenario 7 checks that directly); here nothing looks
// at the outcome but the oracle, which must flag such a grant. Under
// SessionOnlyOwnership the waiter never checks its own key and is
// granted: TestMutantsAreCaught needs the oracle to say so.
func scenarioOracleKeyDeleted(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	prefix := etcdproc.Name(t, "oracle-waiter") + "/"
	o, err := StartOracle(ctx, cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	name := prefix + "lock"
	hs, ws := session(t, ctx, cli, 5*time.Second), session(t, ctx, cli, 5*time.Second)
	holder := lock(t, ctx, hs, name)
	o.Granted(0, hs, holder)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if l, err := ws.Lock(lctx, name); err == nil {
			o.Granted(1, ws, l) // first, before anything else is sent
			l.Unlock(ctx)
		}
	}()
	if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, fmt.Sprintf("%s/%x", name, int64(ws.Lease()))); err != nil {
		t.Fatal(err)
	}
	holder.Unlock(ctx)
	<-done
	res := o.Finish(ctx)
	if res.Lost != nil {
		t.Fatalf("the oracle's history: %v", res.Lost)
	}
	if len(res.Invalid) > 0 {
		return errors.New(res.Invalid[0])
	}
	return nil
}

func TestScenario12OracleKeyDeleted(t *testing.T) {
	if err := scenarioOracleKeyDeleted(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}
