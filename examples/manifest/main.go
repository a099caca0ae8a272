// Command manifest commits batches to an object store's manifest through
// objectfence, with two workers that take turns on one lock, and shows a
// late commit refused.
//
// It runs an embedded etcd (unless -endpoints or ETCD_ENDPOINTS name one)
// and a versitygw S3 gateway on loopback (built once into the user cache
// unless LEASEFENCE_VERSITYGW names it). Worker A holds the lock, writes a
// batch and stalls before its commit: its lease ends meanwhile, as etcd ends
// the lease of a stopped process. Worker B takes the lock, claims the
// manifest, reads it and commits its own batch. A then commits: refused,
// naming both tokens. A reader polls the manifest throughout and checks
// that its token only goes up. The exit status is 0 only if all of that
// held.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/internal/s3test"
	"github.com/leasefence/leasefence/lease"
)

func main() {
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	flag.Parse()
	if err := run(*endpoints, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "manifest:", err)
		os.Exit(1)
	}
}

// errUnsafe: the fence did not keep A's late commit out.
var errUnsafe = errors.New("a late commit was not refused, or the manifest went back")

func run(endpoints string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a first versitygw build takes a minute
	defer cancel()
	cli, closeEtcd, err := exampleenv.Connect(ctx, endpoints, out)
	if err != nil {
		return err
	}
	defer closeEtcd()
	dir, err := os.MkdirTemp("", "manifest-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := s3test.StartVersity(ctx, dir)
	if err != nil {
		return err
	}
	defer srv.Stop()
	bucket, err := srv.Bucket(ctx)
	if err != nil {
		return err
	}
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		return err
	}
	f, err := objectfence.New(store, "tables/orders/manifest")
	if err != nil {
		return err
	}
	s := &scene{ctx: ctx, cli: cli, store: store, f: f, out: out, tl: exampleenv.NewTimeline(out),
		lockName: fmt.Sprintf("manifest-%x/orders", time.Now().UnixNano()&0xffffff)}
	fmt.Fprintf(out, "versitygw %s at %s, bucket %s\n", s3test.VersityVersion, srv.Endpoint, bucket)
	return s.play()
}

type scene struct {
	ctx      context.Context
	cli      *clientv3.Client
	store    objectfence.Store
	f        *objectfence.Fence
	out      io.Writer
	tl       *exampleenv.Timeline
	lockName string
}

func (s *scene) play() error {
	stop := make(chan struct{})
	seen := make(chan []int64)
	go s.reader(stop, seen)
	refused, err := s.workers()
	close(stop)
	tokens := <-seen
	if err != nil {
		return err
	}
	m, err := s.f.Read(s.ctx)
	if err != nil {
		return err
	}
	sorted := slices.IsSorted(tokens)
	s.tl.Printf("reader", "saw the manifest's token as %v", slices.Compact(tokens))
	s.tl.Printf("reader", "manifest now: token %d, batch %q", m.Token, m.Payload)
	orphans, err := s.f.Orphans(s.ctx, func(k string) bool { return k == string(m.Payload) })
	if err != nil {
		return err
	}
	s.tl.Printf("cleanup", "data objects no manifest can make visible any more: %v", orphans)
	if !refused || !sorted {
		return errUnsafe
	}
	fmt.Fprintln(s.out, "SAFE: A's late commit was refused and the manifest only moved forward")
	return nil
}

// workers runs A and B, and reports whether A's late commit was refused.
func (s *scene) workers() (refused bool, err error) {
	sa, err := lease.NewSession(s.ctx, s.cli)
	if err != nil {
		return false, err
	}
	defer sa.Close()
	la, err := sa.Lock(s.ctx, s.lockName)
	if err != nil {
		return false, err
	}
	if _, err := s.f.Claim(s.ctx, la.Token()); err != nil {
		return false, err
	}
	s.tl.Printf("A", "holds %q with token %d, claims the manifest", s.lockName, la.Token())
	first, err := s.batch(la.Token(), "batch-a1", "A")
	if err != nil {
		return false, err
	}
	if _, err := s.f.Commit(s.ctx, la.Token(), []byte(first)); err != nil {
		return false, err
	}
	s.tl.Printf("A", "commits %q", first)
	aBatch, err := s.batch(la.Token(), "batch-a2", "A")
	if err != nil {
		return false, err
	}
	s.tl.Printf("A", "stalls before its commit (a GC pause, a stopped process)")
	// What etcd does to a stopped process's lease when its TTL runs out.
	if _, err := s.cli.Revoke(s.ctx, sa.Lease()); err != nil {
		return false, err
	}
	s.tl.Printf("etcd", "A's lease ends: its lock key is gone")

	if err := s.workerB(); err != nil {
		return false, err
	}

	s.tl.Printf("A", "wakes up and commits %q with token %d", aBatch, la.Token())
	_, err = s.f.Commit(s.ctx, la.Token(), []byte(aBatch))
	var stale *fence.StaleError
	if !errors.As(err, &stale) {
		s.tl.Printf("A", "commit: %v", err)
		return false, nil
	}
	s.tl.Printf("A", "refused: %v", err)
	return true, nil
}

func (s *scene) workerB() error {
	sb, err := lease.NewSession(s.ctx, s.cli)
	if err != nil {
		return err
	}
	defer sb.Close()
	lb, err := sb.Lock(s.ctx, s.lockName)
	if err != nil {
		return err
	}
	defer func() { _ = lb.Unlock(s.ctx) }() // the example's end; Close follows
	s.tl.Printf("B", "takes the lock: token %d", lb.Token())
	m, err := s.f.Claim(s.ctx, lb.Token())
	if err != nil {
		return err
	}
	s.tl.Printf("B", "claims the manifest and reads it: batch %q", m.Payload)
	b, err := s.batch(lb.Token(), "batch-b", "B")
	if err != nil {
		return err
	}
	if _, err := s.f.Commit(s.ctx, lb.Token(), []byte(b)); err != nil {
		return err
	}
	s.tl.Printf("B", "commits %q with token %d", b, lb.Token())
	return nil
}

// batch writes a data object under the writer's token and returns its key.
func (s *scene) batch(token int64, name, who string) (string, error) {
	key, err := s.f.DataKey(token, name)
	if err != nil {
		return "", err
	}
	if _, err := s.store.Put(s.ctx, key, []byte("rows of "+name), objectfence.Condition{}); err != nil {
		return "", err
	}
	s.tl.Printf(who, "writes its batch to %s", key)
	return key, nil
}

// reader polls the manifest until stop, and sends the tokens it saw.
func (s *scene) reader(stop <-chan struct{}, seen chan<- []int64) {
	var tokens []int64
	for {
		if m, err := s.f.Read(s.ctx); err == nil {
			tokens = append(tokens, m.Token)
		}
		select {
		case <-stop:
			seen <- tokens
			return
		case <-time.After(5 * time.Millisecond): // a reader's polling period
		}
	}
}
