package leasetest_test

// These tests are the package's examples: each is a test a user of package
// lease would write for their own worker, against a real etcd, with one of
// the faults the worker must survive. (A go doc Example cannot take a
// *testing.T, which a test server needs.)

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
	"github.com/leasefence/leasefence/lease/leasetest"
)

// writeCheckpoint is the worker's fenced write.
func writeCheckpoint(ctx context.Context, kv clientv3.KV, token int64, value string) error {
	_, err := fence.NewTxn(ctx, kv, fence.Resource("jobs/7/fence", token)).
		Then(clientv3.OpPut("jobs/7/checkpoint", value)).Commit()
	return err
}

// My worker is cut off from etcd; its lock passes to another worker; when
// its network comes back, its late write is refused.
func TestExampleLateWriteRefusedAfterPartition(t *testing.T) {
	srv := leasetest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	workerCli, link := srv.FaultyClient(t)
	s, err := lease.NewSession(ctx, workerCli, lease.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lock(ctx, "jobs/7")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeCheckpoint(ctx, workerCli, l.Token(), "A:1"); err != nil {
		t.Fatal(err)
	}

	link.Drop() // the worker's network fails
	<-l.Done()  // its early warning: the lease could not be renewed
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("lock ended with %v, want ErrLost", l.Err())
	}

	other := srv.Client(t) // a second worker takes over once etcd expires the lease
	s2, err := lease.NewSession(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	l2, err := s2.Lock(ctx, "jobs/7")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeCheckpoint(ctx, other, l2.Token(), "B:1"); err != nil {
		t.Fatal(err)
	}

	link.Restore() // the first worker comes back and writes with its old token
	err = writeCheckpoint(ctx, workerCli, l.Token(), "A:2")
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Highest != l2.Token() {
		t.Fatalf("late write: %v, want refused below token %d", err, l2.Token())
	}
}

// My worker, held by lease.Run, loses its lease to a revoke and carries on
// under a new token.
func TestExampleWorkerResumesAfterRevoke(t *testing.T) {
	srv := leasetest.NewServer(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tokens []int64
	err := lease.Run(ctx, cli, "jobs/7", func(ctx context.Context, l *lease.Lock) error {
		tokens = append(tokens, l.Token())
		if len(tokens) == 2 {
			return nil // resumed under the new token: done
		}
		resp, err := cli.Get(ctx, l.Key())
		if err != nil {
			return err
		}
		srv.RevokeLease(t, clientv3.LeaseID(resp.Kvs[0].Lease))
		<-ctx.Done() // the worker's context ends with the lock
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("tokens %v, want a second, larger one", tokens)
	}
}

// Someone deletes my worker's lock key: the worker hears of it at once.
func TestExampleLockKeyDeleted(t *testing.T) {
	srv := leasetest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := lease.NewSession(ctx, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lock(ctx, "jobs/7")
	if err != nil {
		t.Fatal(err)
	}
	srv.DeleteKey(t, l.Key())
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the lock did not end")
	}
	if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("lock ended with %v, want ErrKeyDeleted", l.Err())
	}
}

// etcd restarts while my worker holds its lock: a short outage within the
// TTL costs nothing.
func TestExampleServerRestart(t *testing.T) {
	srv := leasetest.NewServer(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lock(ctx, "jobs/7")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	srv.Restart(t)
	if err := writeCheckpoint(ctx, cli, l.Token(), "after restart"); err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
	if l.Err() != nil {
		t.Fatalf("lock lost across a short restart: %v", l.Err())
	}
}

// My worker's link is slow, then held: its session gives up before etcd
// does, so the worker stops before a successor can start.
func TestExampleSlowThenHeldLink(t *testing.T) {
	srv := leasetest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, link := srv.FaultyClient(t)
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	link.Delay(100 * time.Millisecond)
	l, err := s.Lock(ctx, "jobs/7")
	if err != nil {
		t.Fatal(err)
	}
	link.Delay(0)
	link.Pause()
	defer link.Resume()
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the lock did not end while its link was held")
	}
	if !errors.Is(l.Err(), lease.ErrLeaseExpired) {
		t.Fatalf("lock ended with %v, want ErrLeaseExpired", l.Err())
	}
}
