package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A checkpoint in etcd, written only while the lock is held.
func ExampleHeld() {
	ctx := context.Background()
	var cli *clientv3.Client // connected elsewhere
	var l *lease.Lock        // from Session.Lock
	_, err := fence.NewTxn(ctx, cli, fence.Held(l)).
		Then(clientv3.OpPut("jobs/7/checkpoint", "offset=4096")).
		Commit()
	switch {
	case errors.Is(err, fence.ErrNotHeld):
		log.Print("lost the lock; the write did not happen")
	case errors.Is(err, fence.ErrOutcomeUnknown):
		log.Print("no answer: read the checkpoint back before deciding")
	case err != nil:
		log.Print(err)
	}
}

// Held's comparisons in a transaction built with clientv3's own Txn: the
// Else runs, instead of an error, when the lock is no longer held.
func ExampleHeldCmps() {
	ctx := context.Background()
	var cli *clientv3.Client
	var l *lease.Lock
	resp, err := cli.Txn(ctx).
		If(fence.HeldCmps(l)...).
		Then(clientv3.OpPut("jobs/7/checkpoint", "offset=4096")).
		Commit()
	if err == nil && !resp.Succeeded {
		log.Print("lost the lock; the write did not happen")
	}
}

// A manifest that must never go back to an older writer's version, even
// after the lock is gone.
func ExampleResource() {
	ctx := context.Background()
	var cli *clientv3.Client
	var l *lease.Lock
	_, err := fence.NewTxn(ctx, cli, fence.Resource("manifests/fence", l.Token())).
		Then(clientv3.OpPut("manifests/current", "v42")).
		Commit()
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		log.Printf("token %d refused: %d already wrote", stale.Token, stale.Highest)
	}
}

// A new holder resumes from the state its predecessor left: it claims the
// record and reads in one transaction, so that a late write of an earlier
// holder can no longer land after the read.
func ExampleClaim() {
	ctx := context.Background()
	var cli *clientv3.Client
	var l *lease.Lock
	resp, err := fence.NewTxn(ctx, cli, fence.Claim("shards/7/fence", l.Token())).
		Then(clientv3.OpGet("shards/7/offset")).
		Commit()
	if err != nil {
		log.Print(err) // a *StaleError: a later holder has claimed already
		return
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		log.Printf("resuming from offset %s", kvs[0].Value)
	}
}

// A writer that writes many times through one fence record keeps a
// Recorder: after its first write with a token, each write leaves the
// record alone and costs about what a Held guard's does.
func ExampleRecorder() {
	ctx := context.Background()
	var cli *clientv3.Client
	var l *lease.Lock
	rec := fence.NewRecorder("shards/7/fence") // one per record, for the life of the process
	for offset := 0; offset < 3; offset++ {
		_, err := fence.NewTxn(ctx, cli, rec.Guard(l.Token())).
			Then(clientv3.OpPut("shards/7/offset", fmt.Sprint(offset))).
			Commit()
		if err != nil {
			log.Print(err) // a *StaleError once a newer holder has written
			return
		}
	}
}

// The caller's own condition: a compare-and-swap that also needs the lock.
func ExampleTxn_If() {
	ctx := context.Background()
	var cli *clientv3.Client
	var l *lease.Lock
	resp, err := fence.NewTxn(ctx, cli, fence.Held(l)).
		If(clientv3.Compare(clientv3.Value("jobs/7/state"), "=", "ready")).
		Then(clientv3.OpPut("jobs/7/state", "running")).
		Else(clientv3.OpGet("jobs/7/state")).
		Commit()
	if err == nil && !resp.Succeeded {
		log.Print("the job was not ready; nothing written")
	}
}

// A service that already locks with etcd's concurrency.Mutex fences its
// writes with the mutex's token, without changing how it locks.
func ExampleFromMutex() {
	ctx := context.Background()
	var cli *clientv3.Client
	s, err := concurrency.NewSession(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, "shards/7")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	holder := fence.FromMutex(m) // after Lock: the key's creation revision
	_, err = fence.NewTxn(ctx, cli, fence.Held(holder), fence.Resource("shards/7-fence", holder.Token())).
		Then(clientv3.OpPut("shards/7-checkpoint", "offset 42")).
		Commit()
	if errors.Is(err, fence.ErrNotHeld) || errors.Is(err, fence.ErrStale) {
		log.Print("the mutex was lost: the write did not happen")
	}
	m.Unlock(ctx)
}

// exampleClient is a client of the etcd the package's tests run (an
// embedded member, or ETCD_ENDPOINTS), with the examples' keys cleared.
// In your own tests, lease/leasetest gives a server and its clients.
func exampleClient() *clientv3.Client {
	cli, err := etcdproc.NewClient(etcd.Endpoints())
	if err != nil {
		log.Fatal(err)
	}
	if _, err := cli.Delete(context.Background(), "examples/", clientv3.WithPrefix()); err != nil {
		log.Fatal(err)
	}
	return cli
}

// Lock, then write only while the lock is held: after Unlock the same
// write is refused by etcd, and nothing is written.
func ExampleHeld_lock() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := exampleClient()
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	l, err := s.Lock(ctx, "examples/held")
	if err != nil {
		log.Fatal(err)
	}
	write := func(v string) error {
		_, err := fence.NewTxn(ctx, cli, fence.Held(l)).
			Then(clientv3.OpPut("examples/held-checkpoint", v)).
			Commit()
		return err
	}
	fmt.Println("while held:", write("offset 1"))
	if err := l.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	err = write("offset 2")
	fmt.Println("after Unlock, not held:", errors.Is(err, fence.ErrNotHeld))

	resp, err := cli.Get(ctx, "examples/held-checkpoint")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("checkpoint: %s\n", resp.Kvs[0].Value)
	// Output:
	// while held: <nil>
	// after Unlock, not held: true
	// checkpoint: offset 1
}

// Two holdings of one lock, one after the other, fence one record with
// Resource guards. The new holder claims the record in the transaction of
// its first read, so the old holder's late write cannot land after that
// read: the record refuses it with a *StaleError.
func ExampleClaim_handoff() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := exampleClient()
	defer cli.Close()
	var sessions []*lease.Session
	defer func() {
		for _, s := range sessions {
			s.Close()
		}
	}()
	take := func() *lease.Lock {
		s, err := lease.NewSession(ctx, cli)
		if err != nil {
			log.Fatal(err)
		}
		sessions = append(sessions, s)
		l, err := s.Lock(ctx, "examples/claim")
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	write := func(l *lease.Lock, v string) error {
		_, err := fence.NewTxn(ctx, cli, fence.Resource("examples/claim-fence", l.Token())).
			Then(clientv3.OpPut("examples/claim-offset", v)).
			Commit()
		return err
	}

	old := take()
	if err := write(old, "10"); err != nil {
		log.Fatal(err)
	}
	if err := old.Unlock(ctx); err != nil { // or its lease expires while it is paused
		log.Fatal(err)
	}

	next := take()
	resp, err := fence.NewTxn(ctx, cli, fence.Claim("examples/claim-fence", next.Token())).
		Then(clientv3.OpGet("examples/claim-offset")).
		Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("new holder resumes from %s\n", resp.Responses[0].GetResponseRange().Kvs[0].Value)

	err = write(old, "20") // the old holder's write, arriving late
	var stale *fence.StaleError
	fmt.Println("late write refused:", errors.As(err, &stale) && stale.Highest == next.Token())
	if err := write(next, "11"); err != nil {
		log.Fatal(err)
	}
	highest, err := fence.ReadRecord(ctx, cli, "examples/claim-fence")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("record holds the new token:", highest == next.Token())
	// Output:
	// new holder resumes from 10
	// late write refused: true
	// record holds the new token: true
}
