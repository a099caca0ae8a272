// Command manifest commits batches to an object store's manifest through
// objectfence, with two workers that take turns on one lock, and shows a
// late commit refused.
//
// It runs an embedded etcd (unless -endpoints or ETCD_ENDPOINTS name one)
// and a versitygw S3 gateway on loopback (built once into the user cache
// unless LEASEFENCE_VERSITYGW names it). Worker A, a separate process,
// takes the lock, claims the manifest, writes a batch under a data key of
// its token and commits a pointer to it. It writes its next batch, checks
// that it still holds the lock, and is then really stopped (SIGSTOP) past
// its lease. etcd expires the lease; worker B takes the lock with a larger
// token, claims the manifest, reads the batch it names and commits its own.
// A is resumed (SIGCONT) and commits its batch: refused with a
// *fence.StaleError naming both tokens. A reader polls the manifest
// throughout, reads each batch it names, and checks that its token only
// goes up. The exit status is 0 only if all of that held.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/internal/s3test"
	"github.com/leasefence/leasefence/lease"
)

// Environment of the child process, worker A.
const (
	envEndpoints = "MANIFEST_ENDPOINTS"
	envS3        = "MANIFEST_S3" // endpoint, access key, secret, bucket: space-separated
	envLock      = "MANIFEST_LOCK"
	envTTL       = "MANIFEST_TTL"
)

// manifestKey is the manifest object both workers commit.
const manifestKey = "tables/orders/manifest"

func main() {
	if os.Getenv(exampleenv.ChildEnv) == "worker-a" {
		if err := workerA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker A:", err)
			os.Exit(1)
		}
		return
	}
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of both workers (etcd grants at least 2s by default)")
	flag.Parse()
	if _, err := run(*endpoints, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "manifest:", err)
		os.Exit(1)
	}
}

// errUnsafe: the fence did not keep A's late commit out.
var errUnsafe = errors.New("worker A's late commit was not refused, or the manifest went back")

// outcome is what a run ended with.
type outcome struct {
	aToken, bToken int64
	refused        bool   // A's late commit failed with a *fence.StaleError
	refusal        string // its error
	tokens         []int64
	wentBack       bool   // the reader saw the token go down
	missing        string // a batch the reader could not read, if any
	final          objectfence.Manifest
	bBatch         string
}

func (o outcome) safe() bool {
	return o.refused && !o.wentBack && o.missing == "" &&
		o.final.Token == o.bToken && string(o.final.Payload) == o.bBatch
}

func run(endpoints string, ttl time.Duration, out io.Writer) (outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a first versitygw build takes a minute
	defer cancel()
	cli, closeEtcd, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return outcome{}, err
	}
	defer closeEtcd()
	dir, err := os.MkdirTemp("", "manifest-example")
	if err != nil {
		return outcome{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := s3test.StartVersity(ctx, dir)
	if err != nil {
		return outcome{}, err
	}
	defer srv.Stop()
	bucket, err := srv.Bucket(ctx)
	if err != nil {
		return outcome{}, err
	}
	lockName := fmt.Sprintf("manifest-%x/orders", time.Now().UnixNano()&0xffffff)
	f, store, err := openFence(srv, bucket, lockName)
	if err != nil {
		return outcome{}, err
	}
	fmt.Fprintf(out, "versitygw %s at %s, bucket %s\n", s3test.VersityVersion, srv.Endpoint, bucket)
	s := &scene{ctx: ctx, cli: cli, store: store, f: f, ttl: ttl, tl: exampleenv.NewTimeline(out),
		lockName: lockName,
		s3env:    strings.Join([]string{srv.Endpoint, srv.Access, srv.Secret, bucket}, " ")}
	res, err := s.play()
	if err != nil {
		return res, err
	}
	fmt.Fprintln(out, res.summary())
	if !res.safe() {
		return res, errUnsafe
	}
	return res, nil
}

func (o outcome) summary() string {
	if o.safe() {
		return fmt.Sprintf("SAFE: A's commit with token %d refused, B's batch (token %d) is the manifest's, the reader saw tokens %v",
			o.aToken, o.bToken, o.tokens)
	}
	return fmt.Sprintf("UNSAFE: A's commit refused: %v; the reader saw tokens %v (went back: %v, unreadable batch: %q); manifest: token %d, %q",
		o.refused, o.tokens, o.wentBack, o.missing, o.final.Token, o.final.Payload)
}

// openFence is the manifest's Fence on bucket of srv, fenced by the lock
// named lockName, and its store.
func openFence(srv *s3test.Server, bucket, lockName string) (*objectfence.Fence, objectfence.Store, error) {
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		return nil, nil, err
	}
	f, err := objectfence.New(store, manifestKey, lockName)
	return f, store, err
}

// scene is one run of the story: worker A (a child process), worker B and
// a reader (this process), on one lock and one manifest.
type scene struct {
	ctx      context.Context
	cli      *clientv3.Client
	store    objectfence.Store
	f        *objectfence.Fence
	ttl      time.Duration
	tl       *exampleenv.Timeline
	lockName string
	s3env    string
	a        *exampleenv.Child
}

func (s *scene) play() (outcome, error) {
	var res outcome
	stop := make(chan struct{})
	seen := make(chan readerResult, 1)
	go s.reader(stop, seen)
	err := s.workers(&res)
	close(stop)
	r := <-seen
	res.tokens, res.wentBack, res.missing = r.tokens, r.wentBack, r.missing
	if err != nil {
		return res, err
	}
	if res.final, err = s.f.Read(s.ctx); err != nil {
		return res, err
	}
	s.tl.Printf("reader", "manifest now: token %d, batch %q", res.final.Token, res.final.Payload)
	orphans, err := s.f.Orphans(s.ctx, func(k string) bool { return k == string(res.final.Payload) })
	if err != nil {
		return res, err
	}
	s.tl.Printf("cleanup", "data objects no manifest can make visible any more: %v", orphans)
	return res, nil
}

// workers runs A's first holding, pauses A past its lease, lets B take
// over, and resumes A for its late commit.
func (s *scene) workers(res *outcome) error {
	a, err := exampleenv.StartChild(s.ctx, "worker A", "worker-a",
		envEndpoints+"="+strings.Join(s.cli.Endpoints(), ","), envS3+"="+s.s3env,
		envLock+"="+s.lockName, envTTL+"="+s.ttl.String())
	if err != nil {
		return err
	}
	defer a.Stop()
	s.a = a
	s.tl.Printf("A", "started as process %d", a.Pid())
	if err := s.aCommits(res); err != nil {
		return err
	}
	if err := s.pauseAUntilExpired(); err != nil {
		return err
	}
	if err := s.bTakesOver(res); err != nil {
		return err
	}
	return s.aResumes(res)
}

// aCommits follows A through its first holding, up to the commit it is
// stopped before.
func (s *scene) aCommits(res *outcome) error {
	tok, err := s.a.Expect("LOCKED ", 30*time.Second)
	if err != nil {
		return err
	}
	res.aToken, _ = strconv.ParseInt(tok, 10, 64)
	s.tl.Printf("A", "takes the lock %q: token %d, lease TTL %v", s.lockName, res.aToken, s.ttl)
	for _, step := range []struct{ prefix, format string }{
		{"CLAIMED ", "claims the manifest: %s"},
		{"WROTE ", "writes its batch to %s"},
		{"COMMITTED ", "commits a pointer to %s"},
		{"WROTE ", "writes its next batch to %s"},
	} {
		got, err := s.a.Expect(step.prefix, 10*time.Second)
		if err != nil {
			return err
		}
		s.tl.Printf("A", step.format, got)
	}
	if _, err := s.a.Expect("CHECKED", 10*time.Second); err != nil {
		return err
	}
	s.tl.Printf("A", "checks lock.Err() == nil: still the holder. Starts its commit...")
	return nil
}

// pauseAUntilExpired stops A with SIGSTOP and waits until etcd has
// expired its lease and deleted its lock key.
func (s *scene) pauseAUntilExpired() error {
	return exampleenv.PauseUntilExpired(s.ctx, s.cli, s.a, s.lockName, s.tl)
}

// bTakesOver takes the lock for B, claims the manifest, reads the batch
// it names and commits B's own.
func (s *scene) bTakesOver(res *outcome) error {
	sb, err := lease.NewSession(s.ctx, s.cli, lease.WithTTL(s.ttl))
	if err != nil {
		return err
	}
	defer sb.Close()
	lb, err := sb.Lock(s.ctx, s.lockName)
	if err != nil {
		return err
	}
	defer func() { _ = lb.Unlock(s.ctx) }() // the example's end
	res.bToken = lb.Token()
	s.tl.Printf("B", "takes the lock: token %d (> %d)", lb.Token(), res.aToken)
	m, err := s.f.Claim(s.ctx, lb.Token())
	if err != nil {
		return err
	}
	rows, _, err := s.store.Get(s.ctx, string(m.Payload))
	if err != nil {
		return err
	}
	s.tl.Printf("B", "claims the manifest (token now %d) and reads the batch it names: %q", lb.Token(), rows)
	if res.bBatch, err = writeBatch(s.ctx, s.store, s.f, lb.Token(), "batch-b1"); err != nil {
		return err
	}
	s.tl.Printf("B", "writes its batch to %s", res.bBatch)
	if _, err := s.f.Commit(s.ctx, m, []byte(res.bBatch)); err != nil {
		return err
	}
	s.tl.Printf("B", "commits a pointer to %s", res.bBatch)
	return nil
}

// aResumes continues A, which finishes the commit it started with its old
// token.
func (s *scene) aResumes(res *outcome) error {
	if err := s.a.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.tl.Printf("A", "resumes: SIGCONT. It still believes it holds the lock, and commits its batch")
	if err := s.a.Send("go"); err != nil {
		return err
	}
	got, err := s.a.Expect("COMMIT ", 30*time.Second)
	if err != nil {
		return err
	}
	res.refusal, res.refused = strings.CutPrefix(got, "REFUSED ")
	if res.refused {
		s.tl.Printf("A", "commit REFUSED: %s", res.refusal)
	} else {
		s.tl.Printf("A", "commit: %s", got)
	}
	if lost, err := s.a.Expect("LOCKERR ", 10*time.Second); err == nil {
		s.tl.Printf("A", "lock.Err() now says %q: an early warning that came too late", lost)
	}
	if err := s.a.Wait(); err != nil {
		return fmt.Errorf("worker A: %v\n%s", err, s.a.Stderr())
	}
	return nil
}

// readerResult is what the reader saw.
type readerResult struct {
	tokens   []int64 // each token the manifest had, in the order seen
	wentBack bool
	missing  string
}

// reader polls the manifest until stop, and once more after, reads the
// batch each new one names, as a reader of the table would, and sends
// what it saw.
func (s *scene) reader(stop <-chan struct{}, seen chan<- readerResult) {
	var r readerResult
	var last objectfence.Manifest
	for {
		s.poll(&last, &r)
		select {
		case <-stop:
			s.poll(&last, &r)
			seen <- r
			return
		case <-time.After(5 * time.Millisecond): // a reader's polling period
		}
	}
}

// poll reads the manifest, and the batch it names if it changed since
// last.
func (s *scene) poll(last *objectfence.Manifest, r *readerResult) {
	m, err := s.f.Read(s.ctx)
	if err != nil || m.Version == last.Version {
		return
	}
	r.wentBack = r.wentBack || m.Token < last.Token
	if m.Token != last.Token {
		r.tokens = append(r.tokens, m.Token)
	}
	s.readBatch(m, r)
	*last = m
}

// readBatch reads the batch m names, if any.
func (s *scene) readBatch(m objectfence.Manifest, r *readerResult) {
	if len(m.Payload) == 0 {
		s.tl.Printf("reader", "sees token %d, no batch yet", m.Token)
		return
	}
	if _, _, err := s.store.Get(s.ctx, string(m.Payload)); err != nil {
		r.missing = string(m.Payload)
		s.tl.Printf("reader", "sees token %d, but cannot read its batch: %v", m.Token, err)
		return
	}
	s.tl.Printf("reader", "sees token %d, reads %s", m.Token, m.Payload)
}

// writeBatch writes a batch's rows under a data key of token, and returns
// the key.
func writeBatch(ctx context.Context, store objectfence.Store, f *objectfence.Fence, token int64, name string) (string, error) {
	key, err := f.DataKey(token, name)
	if err != nil {
		return "", err
	}
	_, err = store.Put(ctx, key, []byte(fmt.Sprintf("rows of %s (token %d)", name, token)), objectfence.Condition{})
	return key, err
}

// workerA is the child process: it takes the lock, claims the manifest,
// commits one batch, writes the next, checks the lock, and then waits for
// a line on stdin (during which it is stopped) before it commits that
// batch with the token it got.
func workerA(in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	f, store, err := childFence()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(envEndpoints), ","), DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close()
	l, err := s.Lock(ctx, os.Getenv(envLock))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "LOCKED", l.Token())
	next, base, err := aFirstBatch(ctx, out, f, store, l.Token())
	if err != nil {
		return err
	}
	if l.Err() != nil {
		return l.Err()
	}
	fmt.Fprintln(out, "CHECKED")
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return err
	}
	_, err = f.Commit(ctx, base, []byte(next))
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		fmt.Fprintln(out, "COMMIT REFUSED", err)
	case err != nil:
		return err
	default:
		fmt.Fprintln(out, "COMMIT ok")
	}
	<-l.Done()
	fmt.Fprintln(out, "LOCKERR", l.Err())
	return nil
}

// aFirstBatch is A's holding up to its stop: it claims the manifest,
// commits one batch, and writes the next, whose key it returns with the
// manifest its commit returned, the base of the next commit.
func aFirstBatch(ctx context.Context, out io.Writer, f *objectfence.Fence, store objectfence.Store, token int64) (string, objectfence.Manifest, error) {
	m, err := f.Claim(ctx, token)
	if err != nil {
		return "", objectfence.Manifest{}, err
	}
	batch := "no batch yet"
	if len(m.Payload) > 0 {
		batch = "batch " + string(m.Payload)
	}
	fmt.Fprintf(out, "CLAIMED token now %d, %s\n", m.Token, batch)
	first, err := writeBatch(ctx, store, f, token, "batch-a1")
	if err != nil {
		return "", objectfence.Manifest{}, err
	}
	fmt.Fprintln(out, "WROTE", first)
	base, err := f.Commit(ctx, m, []byte(first))
	if err != nil {
		return "", objectfence.Manifest{}, err
	}
	fmt.Fprintln(out, "COMMITTED", first)
	next, err := writeBatch(ctx, store, f, token, "batch-a2")
	if err != nil {
		return "", objectfence.Manifest{}, err
	}
	fmt.Fprintln(out, "WROTE", next)
	return next, base, nil
}

// childFence is the manifest's Fence for worker A, on the gateway the
// parent named.
func childFence() (*objectfence.Fence, objectfence.Store, error) {
	p := strings.Fields(os.Getenv(envS3))
	if len(p) != 4 {
		return nil, nil, fmt.Errorf("%s=%q: want endpoint, access key, secret and bucket", envS3, os.Getenv(envS3))
	}
	return openFence(&s3test.Server{Endpoint: p[0], Access: p[1], Secret: p[2]}, p[3], os.Getenv(envLock))
}
