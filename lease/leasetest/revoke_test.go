package leasetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/lease"
	"github.com/leasefence/leasefence/lease/leasetest"
)

// RevokeLease ends the session's locks with ErrLost and then the session
// with ErrLeaseExpired, as its doc says.
func TestRevokeLeaseEnds(t *testing.T) {
	srv := leasetest.NewServer(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lock(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	srv.RevokeLease(t, s.Lease())
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the lock did not end")
	}
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("lock Err = %v, want ErrLost", l.Err())
	}
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("the session did not end")
	}
	if !errors.Is(s.Err(), lease.ErrLeaseExpired) {
		t.Fatalf("session Err = %v, want ErrLeaseExpired", s.Err())
	}
}
