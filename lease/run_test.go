package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// keyGone tells whether key is absent.
func keyGone(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) == 0
}

// fn returns while the lock is held: Run releases the lock, closes its
// session, and returns fn's result.
func TestRunReleasesWhenFnReturns(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	boom := errors.New("boom")
	for _, fnErr := range []error{nil, boom} {
		t.Run(fmt.Sprint(fnErr), func(t *testing.T) {
			before := leaseCount(t)
			var key string
			err := lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, etcdproc.Name(t, "run-returns"), func(ctx context.Context, l *lease.Lock) error {
				key = l.Key()
				return fnErr
			}, lease.WithTTL(shortTTL))
			if fnErr == nil && err != nil || fnErr != nil && !errors.Is(err, fnErr) {
				t.Fatalf("Run: %v, want %v", err, fnErr)
			}
			if !keyGone(t, cli, key) {
				t.Fatalf("lock key %s left behind", key)
			}
			if after := leaseCount(t); after != before {
				t.Fatalf("leases %d -> %d: the session was not closed", before, after)
			}
		})
	}
}

// A lost lock is taken again, with a larger token, on a new session when
// the old one ended; fn's context ends with the loss.
func TestRunRetakesAfterLoss(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for _, how := range []string{"key deleted", "lease revoked"} {
		t.Run(how, func(t *testing.T) {
			name := etcdproc.Name(t, "run-loss")
			var tokens []int64
			var leases []string
			err := lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, name, func(ctx context.Context, l *lease.Lock) error {
				tokens = append(tokens, l.Token())
				leases = append(leases, l.Key())
				if len(tokens) > 1 {
					return nil
				}
				var err error
				if how == "key deleted" {
					_, err = cli.Delete(ctx, l.Key())
				} else {
					resp, gerr := cli.Get(ctx, l.Key())
					if gerr != nil || len(resp.Kvs) != 1 {
						return errors.New("own key unreadable")
					}
					_, err = cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
				}
				if err != nil {
					return err
				}
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), lease.ErrLost) {
					t.Errorf("fn's context ended with %v, want ErrLost", context.Cause(ctx))
				}
				return ctx.Err()
			}, lease.WithTTL(shortTTL))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(tokens) != 2 || tokens[1] <= tokens[0] {
				t.Fatalf("tokens %v: want a second, larger one", tokens)
			}
			if how == "lease revoked" && leases[0] == leases[1] {
				t.Fatalf("the second holding reused the revoked session's key %s", leases[0])
			}
		})
	}
}

func TestRunStopsWithContext(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "run-ctx")
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	var key string
	err := lease.Run(ctx, cli, name, func(fctx context.Context, l *lease.Lock) error {
		key = l.Key()
		cancel()
		<-fctx.Done()
		return fctx.Err()
	}, lease.WithTTL(shortTTL))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	if !keyGone(t, cli, key) {
		t.Fatalf("lock key %s left behind", key)
	}
}

func TestRunBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	var called atomic.Bool
	fn := func(context.Context, *lease.Lock) error { called.Store(true); return nil }
	before := leaseCount(t)
	for what, err := range map[string]error{
		"nil client": lease.Run(etcdproc.Ctx(t, 30*time.Second), nil, "x", fn),
		"nil fn":     lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, "x", nil),
		"bad name":   lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, "x/", fn),
		"bad option": lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, "x", fn, lease.WithTTL(0)),
		"nil option": lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, "x", fn, nil),
		"lead nil":   lease.Lead(etcdproc.Ctx(t, 30*time.Second), cli, "x", "v", nil),
	} {
		if !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", what, err)
		}
	}
	if called.Load() {
		t.Error("fn was called on bad input")
	}
	if after := leaseCount(t); after != before {
		t.Errorf("leases %d -> %d: bad input granted a lease", before, after)
	}
}

// A fenced write under way inside fn when the lock is lost gets the
// fence's verdict through WriteContext: stale, not an unknown outcome.
func TestRunLateFencedWriteIsStale(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "run-late")
	rec := name + "-fence"
	write := func(ctx context.Context, token int64, v string) error {
		_, err := fence.NewTxn(ctx, cli, fence.Resource(rec, token)).Then(clientv3.OpPut(name+"-data", v)).Commit()
		return err
	}
	var lateErr, plainErr error
	calls := 0
	err := lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, name, func(ctx context.Context, l *lease.Lock) error {
		calls++
		if calls > 1 {
			return write(ctx, l.Token(), "after") // the new holding's first write
		}
		wctx, cancel := l.WriteContext(ctx)
		defer cancel()
		if err := write(wctx, l.Token(), "first"); err != nil {
			return err
		}
		// The lock is lost and a successor writes, while this fn still runs.
		if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
			return err
		}
		succ := mustLock(t, newSession(t, cli), name)
		if err := write(etcdproc.Ctx(t, 30*time.Second), succ.Token(), "successor"); err != nil {
			return err
		}
		if err := succ.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			return err
		}
		<-ctx.Done()
		lateErr = write(wctx, l.Token(), "late")
		plainErr = write(ctx, l.Token(), "late")
		return lateErr
	}, lease.WithTTL(shortTTL))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var stale *fence.StaleError
	if !errors.As(lateErr, &stale) {
		t.Fatalf("late write through WriteContext: %v, want a *fence.StaleError", lateErr)
	}
	if errors.Is(plainErr, fence.ErrOutcomeUnknown) || !errors.Is(plainErr, lease.ErrLost) {
		t.Fatalf("late write on fn's ended context: %v, want 'not sent' with the lock's loss", plainErr)
	}
	if calls != 2 {
		t.Fatalf("fn called %d times, want 2", calls)
	}
}

func TestLeadRetakesAfterLoss(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "lead")
	var tokens []int64
	err := lease.Lead(etcdproc.Ctx(t, 30*time.Second), cli, name, "me", func(ctx context.Context, l *lease.Leadership) error {
		tokens = append(tokens, l.Token())
		if ld, err := lease.CurrentLeader(ctx, cli, name); err != nil || ld.Token != l.Token() || ld.Value != "me" {
			t.Errorf("CurrentLeader = %+v, %v; want token %d, value me", ld, err, l.Token())
		}
		if len(tokens) > 1 {
			return nil
		}
		if _, err := cli.Delete(ctx, l.Key()); err != nil {
			return err
		}
		<-ctx.Done()
		return nil // fn says nothing of the loss: Lead sees it
	}, lease.WithTTL(shortTTL))
	if err != nil {
		t.Fatalf("Lead: %v", err)
	}
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("tokens %v: want a second, larger one", tokens)
	}
}

// fn fails because its lock was lost before the lock noticed (here: the key
// is deleted and fn returns at once): Run counts the loss, not the error.
func TestRunErrorAfterUnnoticedLoss(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "run-unnoticed")
	calls := 0
	err := lease.Run(etcdproc.Ctx(t, 30*time.Second), cli, name, func(ctx context.Context, l *lease.Lock) error {
		calls++
		if calls > 1 {
			return nil
		}
		if _, err := cli.Delete(ctx, l.Key()); err != nil {
			return err
		}
		return errors.New("write refused: stale")
	}, lease.WithTTL(shortTTL))
	if err != nil || calls != 2 {
		t.Fatalf("Run: %v after %d calls, want nil after 2", err, calls)
	}
}
