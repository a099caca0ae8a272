package lease_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Every kind of holding shows its session's owner in Inspect, and the
// queue keys stay exactly what etcd's own lock and election write.
func TestOwnerInInspect(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "owner")
	reader := newSession(t, cli, lease.WithOwner("reader-1"))
	mustRLock(t, reader, name)
	writer := newSession(t, cli, lease.WithOwner("writer-2"))
	candidate := newSession(t, cli)
	// etcd's own Mutex: no owner record.
	cs, err := concurrency.NewSession(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	done := make(chan error, 3)
	go func() { _, err := writer.Lock(ctx, name); done <- err }()
	waitEntries(t, cli, name, 2)
	go func() { _, err := candidate.Campaign(ctx, name, "addr:7"); done <- err }()
	waitEntries(t, cli, name, 3)
	go func() { done <- concurrency.NewMutex(cs, name).Lock(ctx) }()
	waitEntries(t, cli, name, 4)

	entries, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := []struct {
		owner, value string
		mode         lease.Mode
	}{
		{"reader-1", lease.ReaderValue, lease.Read},
		{"writer-2", "", lease.Write},
		{host + "/" + strconv.Itoa(os.Getpid()), "addr:7", lease.Write},
		{"", "", lease.Write},
	}
	if len(entries) != len(want) {
		t.Fatalf("entries %+v, want %d", entries, len(want))
	}
	for i, w := range want {
		if e := entries[i]; e.Owner != w.owner || e.Value != w.value || e.Mode != w.mode {
			t.Errorf("entry %d: owner %q value %q mode %v, want %q %q %v", i, e.Owner, e.Value, e.Mode, w.owner, w.value, w.mode)
		}
	}
	if got := candidate.Owner(); got != want[2].owner {
		t.Errorf("default Owner() = %q, want %q", got, want[2].owner)
	}
	// The owner record goes with its session.
	if err := reader.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), lease.OwnerKey(reader.Lease())); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("owner record after Close: %v %v", resp, err)
	}
	cancel()
	for range 3 {
		<-done
	}
}

func TestWithOwnerBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for _, owner := range []string{"", strings.Repeat("x", lease.MaxOwnerLen+1), "a\x01b", "\xff"} {
		before, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithOwner(owner)); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Fatalf("WithOwner(%q): %v, want ErrInvalidArgument", owner, err)
		}
		after, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any")
		if err != nil {
			t.Fatal(err)
		}
		if after.Header.Revision != before.Header.Revision {
			t.Fatalf("WithOwner(%q) wrote to etcd", owner)
		}
	}
}

// A lock asked for right after an outside revoke of the session's lease
// reports the loss at once, and the session ends with it.
func TestLockAfterOutsideRevoke(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli, lease.WithTTL(10*time.Second))
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease()); err != nil {
		t.Fatal(err)
	}
	_, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), etcdproc.Name(t, "revoked"))
	if !errors.Is(err, lease.ErrLeaseExpired) || !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Lock after revoke: %v, want ErrLeaseExpired", err)
	}
	if !errors.Is(s.Err(), lease.ErrLeaseExpired) {
		t.Fatalf("session Err after the refused put: %v", s.Err())
	}
}

// The context of a lock that has ended is done when it is returned.
func TestContextOfEndedLock(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	l := mustLock(t, newSession(t, cli), etcdproc.Name(t, "ended"))
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		ctx, cancel := l.Context(context.Background())
		err, cause := ctx.Err(), context.Cause(ctx)
		cancel()
		if err == nil || !errors.Is(cause, lease.ErrUnlocked) {
			t.Fatalf("context of an unlocked lock: %v, cause %v", err, cause)
		}
	}
}

// Run against an etcd that does not answer says so, with the endpoints,
// while it keeps trying, and counts it in the hooks.
func TestRunWarnsWhileUnanswered(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, addr := etcdproc.Unanswered(t)
	core, logs := observer.New(zap.WarnLevel)
	unanswered := make(chan time.Duration, 1)
	hooks := &lease.Hooks{Unanswered: func(d time.Duration) {
		select {
		case unanswered <- d:
		default:
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- lease.Run(ctx, cli, "unanswered", func(context.Context, *lease.Lock) error { return nil },
			lease.WithLogger(zap.New(core)), lease.WithHooks(hooks))
	}()
	select {
	case waited := <-unanswered:
		if waited < 2*time.Second {
			t.Errorf("reported after %v, before 2s", waited)
		}
	case err := <-done:
		t.Fatalf("Run returned before any report: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no report within 10s")
	}
	// The warning is logged before the hook is called.
	found := false
	for _, e := range logs.All() {
		eps, _ := e.ContextMap()["endpoints"].([]any)
		found = found || (strings.Contains(e.Message, "not answered") && len(eps) == 1 && eps[0] == addr)
	}
	if !found {
		t.Fatalf("no warning naming %s: %v", addr, logs.All())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: %v", err)
	}
}
