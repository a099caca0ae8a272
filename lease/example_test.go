package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Take a lock, do work under it with a context that ends if the lock is lost,
// and pass the token to whatever is written.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	s, err := lease.NewSession(ctx, cli, lease.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	l, err := s.Lock(ctx, "shards/7")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(context.Background())

	work, stop := l.Context(ctx)
	defer stop()
	fmt.Println("holding", l.Key(), "with token", l.Token())
	<-work.Done() // the work; it ends early if the lock is lost
}

// Hold a shard's lock for as long as the work runs, and take it again if
// it is lost: each holding resumes from the fenced checkpoint, and every
// write carries the holding's token.
func ExampleRun() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	logger, err := zap.NewProduction() // your service's logger
	if err != nil {
		log.Fatal(err)
	}

	err = lease.Run(ctx, cli, "shards/7", func(ctx context.Context, l *lease.Lock) error {
		// ctx ends if the lock is lost; writes use WriteContext, so that a
		// late one is refused by the fence rather than cut off unanswered.
		wctx, cancel := l.WriteContext(ctx)
		defer cancel()
		// Resume: claim the fence and read in one transaction, so that
		// no earlier holder's late write can land after this read.
		resp, err := fence.NewTxn(wctx, cli, fence.Claim("shards/7/fence", l.Token())).
			Then(clientv3.OpGet("shards/7/checkpoint")).
			Commit()
		if err != nil {
			return err
		}
		offset := "offset 0"
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			offset = string(kvs[0].Value)
		}
		_, err = fence.NewTxn(wctx, cli, fence.Resource("shards/7/fence", l.Token())).
			Then(clientv3.OpPut("shards/7/checkpoint", offset+"+1")).
			Commit()
		return err
	}, lease.WithTTL(10*time.Second), lease.WithLogger(logger))
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleSession_TryLock() {
	ctx := context.Background()
	var s *lease.Session // from lease.NewSession
	l, err := s.TryLock(ctx, "scheduler")
	switch {
	case err == nil:
		defer l.Unlock(ctx)
		fmt.Println("we are the scheduler, token", l.Token())
	case errors.Is(err, lease.ErrLocked):
		fmt.Println("someone else is the scheduler")
	default:
		log.Print(err)
	}
}

// Campaign for leadership, fence the leader's work with its token, and step
// down when done. The loop ends by itself if leadership is lost.
func ExampleSession_Campaign() {
	ctx := context.Background()
	var s *lease.Session // from lease.NewSession
	lead, err := s.Campaign(ctx, "scheduler/leader", "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	defer lead.Resign(ctx)
	work, stop := lead.Context(ctx)
	defer stop()
	fmt.Println("leading with token", lead.Token())
	<-work.Done() // schedule jobs, each write fenced with lead.Token()
	fmt.Println("no longer leader:", lead.Err())
}

// Follow the leader: each Leader carries the value it proclaimed and its
// token, in commit order.
func ExampleObserve() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cli *clientv3.Client // from clientv3.New
	o, err := lease.Observe(ctx, cli, "scheduler/leader")
	if err != nil {
		log.Fatal(err)
	}
	defer o.Close()
	for ld := range o.Leaders() {
		fmt.Printf("leader %s at %s, token %d\n", ld.Key, ld.Value, ld.Token)
	}
}

// A process with a session per shard renews them all through one Keeper,
// and their locks of one name share what the process hears from etcd.
func ExampleKeeper() {
	ctx := context.Background()
	var cli *clientv3.Client // connected elsewhere
	k, err := lease.NewKeeper(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer k.Close() // closes the sessions still open
	for shard := 0; shard < 64; shard++ {
		s, err := lease.NewSession(ctx, cli, lease.WithKeeper(k))
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer s.Close()
			l, err := s.Lock(ctx, fmt.Sprintf("shards/%d", shard))
			if err != nil {
				return
			}
			<-l.Done()
		}()
	}
}

// Readers share a name, a writer excludes them; the read is fenced by the
// read holding, so it never comes from a holding a writer has replaced.
// A worker that owns thousands of shards, against an etcd with auth on,
// takes them through a Pool: no lease carries more than 1,000 of its
// locks, so each lock's put costs etcd's permission check on at most
// that many keys.
func ExamplePool() {
	ctx := context.Background()
	var cli *clientv3.Client // connected elsewhere, as a non-root user
	k, err := lease.NewKeeper(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer k.Close()
	p, err := lease.NewPool(k, 1000)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close() // releases every lock it took
	var owned []*lease.Lock
	for shard := 0; shard < 10000; shard++ {
		l, err := p.TryLock(ctx, fmt.Sprintf("shards/%d", shard))
		if errors.Is(err, lease.ErrLocked) {
			continue // another worker owns it
		}
		if err != nil {
			log.Fatal(err)
		}
		owned = append(owned, l) // fence each write with l.Token()
	}
	fmt.Println(len(owned), "shards on", p.Sessions(), "sessions")
}

func ExampleSession_RLock() {
	ctx := context.Background()
	var s *lease.Session     // from lease.NewSession
	var cli *clientv3.Client // the session's client
	r, err := s.RLock(ctx, "manifest")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Unlock(ctx)
	resp, err := fence.NewTxn(ctx, cli, fence.Held(r)).
		Then(clientv3.OpGet("manifest/current")).
		Commit()
	if err != nil {
		log.Fatal(err) // fence.ErrNotHeld: the read holding had ended
	}
	fmt.Println(r.Mode(), "holding, token", r.Token(), resp.Responses[0].GetResponseRange().Count)
}

// A resource that cannot check a token (a legacy service, a mailer): after
// a holder crashed, the next one waits 15 s before it is granted, so that
// what the crashed holder sent has drained. Every session taking the name
// should use the same option.
func ExampleWithLockDelay() {
	ctx := context.Background()
	var cli *clientv3.Client // from clientv3.New
	s, err := lease.NewSession(ctx, cli, lease.WithLockDelay(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // releases its locks cleanly first: no delay for the next holder
	l, err := s.Lock(ctx, "mailer")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	fmt.Println("sending as token", l.Token())
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

// A worker held by Run resumes each holding with a claim: the claim and
// the read of the checkpoint are one transaction, so no write of an
// earlier holder can land after the read. This one does its work once and
// returns, and Run releases the lock.
func ExampleRun_claim() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := exampleClient()
	defer cli.Close()

	err := lease.Run(ctx, cli, "examples/run", func(ctx context.Context, l *lease.Lock) error {
		wctx, cancel := l.WriteContext(ctx)
		defer cancel()
		resp, err := fence.NewTxn(wctx, cli, fence.Claim("examples/run-fence", l.Token())).
			Then(clientv3.OpGet("examples/run-checkpoint")).
			Commit()
		if err != nil {
			return err
		}
		fmt.Println("checkpoints found:", resp.Responses[0].GetResponseRange().Count)
		_, err = fence.NewTxn(wctx, cli, fence.Resource("examples/run-fence", l.Token())).
			Then(clientv3.OpPut("examples/run-checkpoint", "offset 1")).
			Commit()
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	resp, err := cli.Get(ctx, "examples/run-checkpoint")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("checkpoint: %s\n", resp.Kvs[0].Value)
	// Output:
	// checkpoints found: 0
	// checkpoint: offset 1
}

// Leader election: a candidate campaigns, an observer sees it lead with
// its value, and the leadership's token fences its work as a lock's does.
func ExampleSession_Campaign_observe() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := exampleClient()
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	lead, err := s.Campaign(ctx, "examples/leader", "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	o, err := lease.Observe(ctx, cli, "examples/leader")
	if err != nil {
		log.Fatal(err)
	}
	defer o.Close()
	ld := <-o.Leaders()
	fmt.Println("leader:", ld.Value, "same token:", ld.Token == lead.Token())

	if err := lead.Proclaim(ctx, "10.0.0.7:9090"); err != nil {
		log.Fatal(err)
	}
	ld = <-o.Leaders()
	fmt.Println("leader:", ld.Value, "same token:", ld.Token == lead.Token())

	if err := lead.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = lease.CurrentLeader(ctx, cli, "examples/leader")
	fmt.Println("after Resign:", errors.Is(err, lease.ErrNoLeader))
	// Output:
	// leader: 10.0.0.7:8080 same token: true
	// leader: 10.0.0.7:9090 same token: true
	// after Resign: true
}

// Inspect shows a lock's queue: the holder first, then the waiters in the
// order they will be granted, with the owner each session recorded.
func ExampleInspect() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := exampleClient()
	defer cli.Close()
	a, err := lease.NewSession(ctx, cli, lease.WithOwner("worker-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := lease.NewSession(ctx, cli, lease.WithOwner("worker-b"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	held, err := a.Lock(ctx, "examples/inspect")
	if err != nil {
		log.Fatal(err)
	}
	waited := make(chan *lease.Lock)
	go func() {
		l, err := b.Lock(ctx, "examples/inspect") // waits behind worker-a
		if err != nil {
			log.Fatal(err)
		}
		waited <- l
	}()

	var q []lease.QueueEntry
	for len(q) < 2 { // until worker-b has queued
		if q, err = lease.Inspect(ctx, cli, "examples/inspect"); err != nil {
			log.Fatal(err)
		}
	}
	for _, e := range q {
		fmt.Println(e.Owner, e.Mode)
	}
	fmt.Println("holding:", lease.Holding(q), "holder's token first:", q[0].Token == held.Token() && q[0].Token < q[1].Token)

	if err := held.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	next := <-waited
	fmt.Println("next holder's token is larger:", next.Token() > held.Token())
	if err := next.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// worker-a write
	// worker-b write
	// holding: 1 holder's token first: true
	// next holder's token is larger: true
}
