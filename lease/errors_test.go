package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Every error names the package once, however deep it is wrapped.
func TestErrorsNamePackageOnce(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "once")
	l := mustLock(t, s, name)
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	_, observeErr := lease.Observe(etcdproc.Ctx(t, 30*time.Second), nil, "x")
	_, leaderErr := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), nil, "x")
	_, noLeaderErr := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, name)
	cases := map[string]error{
		"unlock after loss": l.Unlock(etcdproc.Ctx(t, 30*time.Second)),
		"observe nil":       observeErr,
		"leader nil":        leaderErr,
		"no leader":         noLeaderErr,
	}
	for what, err := range cases {
		if err == nil {
			t.Errorf("%s: no error", what)
			continue
		}
		if n := strings.Count(err.Error(), "lease:"); n != 1 {
			t.Errorf("%s: %q names the package %d times", what, err, n)
		}
	}
}

// A Lock whose ctx ends says what it waited behind, and matches the ctx's
// error.
func TestLockDeadlineNamesPredecessor(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "behind")
	holder := mustLock(t, newSession(t, cli), name)
	ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 300*time.Millisecond)
	defer cancel()
	_, err := newSession(t, cli).Lock(ctx, name)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), holder.Key()) || !strings.Contains(err.Error(), "token ") {
		t.Fatalf("Lock: %q does not name the holder %s", err, holder.Key())
	}
}

// TryLock says who holds the lock: this same session, or another holder by
// key and token.
func TestTryLockSaysWhoHolds(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "who")
	s := newSession(t, cli)
	held := mustLock(t, s, name)
	_, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
	if !errors.Is(err, lease.ErrLocked) || !strings.Contains(err.Error(), "this same session") {
		t.Fatalf("TryLock on the holding session: %v", err)
	}
	_, err = newSession(t, cli).TryLock(etcdproc.Ctx(t, 30*time.Second), name)
	if !errors.Is(err, lease.ErrLocked) || !strings.Contains(err.Error(), held.Key()) {
		t.Fatalf("TryLock on another session: %v, want the holder %s named", err, held.Key())
	}
}

// Close of a session whose lease is already gone returns at once and says
// how the session ended.
func TestCloseAfterLoss(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease()); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	start := time.Now()
	err = s.Close()
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close took %v after the session had ended", took)
	}
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Close: %v, want an error wrapping ErrLost", err)
	}
	if err := s.Close(); !errors.Is(err, lease.ErrSessionClosed) {
		t.Fatalf("second Close: %v, want ErrSessionClosed", err)
	}
}
