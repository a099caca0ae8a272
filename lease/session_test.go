package lease_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func TestNewSessionBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	cases := []struct {
		name string
		opts []lease.Option
	}{
		{"ttl zero", []lease.Option{lease.WithTTL(0)}},
		{"ttl below a second", []lease.Option{lease.WithTTL(999 * time.Millisecond)}},
		{"ttl negative", []lease.Option{lease.WithTTL(-time.Second)}},
		{"nil option", []lease.Option{nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := leaseCount(t)
			_, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, tc.opts...)
			if !errors.Is(err, lease.ErrInvalidArgument) {
				t.Fatalf("NewSession: %v, want ErrInvalidArgument", err)
			}
			if after := leaseCount(t); after != before {
				t.Errorf("leases went from %d to %d: bad input granted a lease", before, after)
			}
		})
	}
	t.Run("nil client", func(t *testing.T) {
		if _, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), nil); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Fatalf("NewSession(nil): %v, want ErrInvalidArgument", err)
		}
	})
}

func leaseCount(t *testing.T) int {
	t.Helper()
	cli := etcd.Client(t)
	resp, err := cli.Leases(etcdproc.Ctx(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

func TestLockBadNames(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	for _, name := range []string{"", "/", "jobs/", "a//b", "jobs\n7", "jobs\x007", "jobs\r"} {
		before, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any")
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
		if !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("Lock(%q): %v, want ErrInvalidArgument", name, err)
		}
		if n := strings.Count(err.Error(), "lease:"); n != 1 {
			t.Errorf("Lock(%q): %q names the package %d times", name, err, n)
		}
		if _, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("TryLock(%q): %v, want ErrInvalidArgument", name, err)
		}
		after, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any")
		if err != nil {
			t.Fatal(err)
		}
		if after.Header.Revision != before.Header.Revision {
			t.Errorf("Lock(%q) wrote to etcd", name)
		}
	}
}

// An unreachable etcd is an error within the ctx deadline, never a hang.
func TestUnreachableEtcd(t *testing.T) {
	etcdproc.LeakCheck(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cli, err := etcdproc.NewClient([]string{"http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err = lease.NewSession(ctx, cli)
	if err == nil {
		t.Fatal("NewSession against an unreachable etcd succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("NewSession took %v with a 1s deadline", d)
	}
}

func TestSessionTTLAndClose(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), s.Lease())
	if err != nil {
		t.Fatal(err)
	}
	if granted := time.Duration(ttl.GrantedTTL) * time.Second; s.TTL() != granted || granted < 2*time.Second {
		t.Errorf("TTL() = %v, etcd granted %v (asked 1.5s, rounded up to 2s)", s.TTL(), granted)
	}
	l := mustLock(t, s, etcdproc.Name(t, "close"))
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	expectDone(t, s.Done(), time.Second, "Session.Done after Close")
	if !errors.Is(s.Err(), lease.ErrSessionClosed) || !errors.Is(l.Err(), lease.ErrSessionClosed) {
		t.Errorf("after Close: session %v, lock %v; want ErrSessionClosed", s.Err(), l.Err())
	}
	if resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("lock key survived Close: %v %v", resp, err)
	}
	if err := s.Close(); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), "x"); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("Lock on a closed session: %v", err)
	}
}

// A new session's deadline is its grant's send time plus the TTL, less
// the loss margin of a twentieth of the TTL.
func TestSessionDeadlineKeepsLossMargin(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for _, ttl := range []time.Duration{2 * time.Second, 30 * time.Second, 60 * time.Second} {
		before := time.Now()
		s := newSession(t, cli, lease.WithTTL(ttl))
		after := time.Now()
		margin := min(s.TTL()/20, time.Second)
		lo, hi := before.Add(s.TTL()-margin), after.Add(s.TTL()-margin)
		if d := s.Deadline(); d.Before(lo) || d.After(hi) {
			t.Errorf("TTL %v: deadline %v after the grant began, want within [%v, %v]",
				s.TTL(), d.Sub(before), lo.Sub(before), hi.Sub(before))
		}
	}
}

// The session renews the lease for longer than its TTL.
func TestSessionKeepsLeaseAlive(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli, lease.WithTTL(shortTTL))
	l := mustLock(t, s, etcdproc.Name(t, "alive"))
	select {
	case <-l.Done():
		t.Fatalf("lock lost while the session should keep it: %v", l.Err())
	case <-time.After(2 * s.TTL()):
	}
	ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), s.Lease())
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease not alive after 2×TTL: %v %v", ttl, err)
	}
	if !s.Deadline().After(time.Now()) {
		t.Errorf("deadline %v is in the past", s.Deadline())
	}
}
