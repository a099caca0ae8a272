package fencestore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// forged is a well-formed token no etcd will reach for years.
const forged = 9000000000000000000

func newSession(t *testing.T, cli *clientv3.Client) *lease.Session {
	t.Helper()
	s, err := lease.NewSession(context.Background(), cli, lease.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func verifier(t *testing.T, kv clientv3.KV, opts ...fencestore.VerifierOption) *fencestore.EtcdVerifier {
	t.Helper()
	v, err := fencestore.NewEtcdVerifier(kv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// wantUnverified checks that err refuses token as not the holder's of
// name, naming key (the key etcd showed with it, "" for none) and ahead
// (the older key it waits behind, "" for none).
func wantUnverified(t *testing.T, err error, name string, token int64, key string, ahead ...string) {
	t.Helper()
	var ue *fence.UnverifiedError
	want := append(ahead, "")[0]
	if !errors.As(err, &ue) || !errors.Is(err, fence.ErrUnverified) || ue.Name != name || ue.Token != token || ue.Key != key || ue.Ahead != want || ue.Revision <= 0 {
		t.Fatalf("err = %v, want token %d of %q unverified (key %q, ahead %q)", err, token, name, key, want)
	}
	if errors.Is(err, fence.ErrStale) {
		t.Fatalf("err = %v: an unverified token is not stale", err)
	}
}

// keyOf finds the key of a lock session s has queued under name, with
// its creation revision: a waiter's token, which no Lock call returned yet.
func keyOf(t *testing.T, cli *clientv3.Client, name string, s *lease.Session, key ...string) int64 {
	t.Helper()
	want := append(key, "")[0]
	if s != nil {
		want = fmt.Sprintf("%s/%x", name, int64(s.Lease()))
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := cli.Get(context.Background(), want)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 {
			return resp.Kvs[0].CreateRevision
		}
		time.Sleep(10 * time.Millisecond) // polling etcd for the waiter's put, bounded by the deadline
	}
	t.Fatalf("no key %s", want)
	return 0
}

// The verification rule against a real etcd: a holder's token and
// readers' that share the name pass; a waiter's (behind the holder, or a
// reader behind a waiting writer), a number above etcd's revision, a
// revision that created no key of the name, a lock nested under the name,
// a key moved off its lease and a released holding's key do not. Once
// the holder releases, its waiter's token passes.
func TestEtcdVerifierRule(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "jobs/compact")
	v := verifier(t, cli)
	s1, s2 := newSession(t, cli), newSession(t, cli)

	l1, err := s1.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(ctx, name, l1.Token()); err != nil {
		t.Fatalf("holder's token: %v", err)
	}

	// A waiter's key is no holder's until its turn comes.
	granted := make(chan *lease.Lock, 1)
	go func() {
		l, err := s2.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	waiter := keyOf(t, cli, name, s2)
	wantUnverified(t, v.Verify(ctx, name, waiter), name, waiter, fmt.Sprintf("%s/%x", name, int64(s2.Lease())), l1.Key())

	err = v.Verify(ctx, name, forged)
	wantUnverified(t, err, name, forged, "")
	var ue *fence.UnverifiedError
	if errors.As(err, &ue) && ue.Token <= ue.Revision {
		t.Fatalf("forged token %d at revision %d", ue.Token, ue.Revision)
	}

	other, err := cli.Put(ctx, name+"-data", "x") // a revision that created no key of the lock
	if err != nil {
		t.Fatal(err)
	}
	wantUnverified(t, v.Verify(ctx, name, other.Header.Revision), name, other.Header.Revision, "")

	nested, err := s1.Lock(ctx, name+"/sub") // its key is under name/, one level down
	if err != nil {
		t.Fatal(err)
	}
	wantUnverified(t, v.Verify(ctx, name, nested.Token()), name, nested.Token(), "")
	if err := v.Verify(ctx, name+"/sub", nested.Token()); err != nil {
		t.Fatalf("nested lock's token for its own name: %v", err)
	}

	// Readers share a name: each reader's token is a holder's. A reader
	// queued behind a waiting writer waits, and is refused.
	rname := etcdproc.Name(t, "reports")
	s3, s4 := newSession(t, cli), newSession(t, cli)
	r1, err := s3.RLock(ctx, rname)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s4.RLock(ctx, rname)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*lease.Lock{r1, r2} {
		if err := v.Verify(ctx, rname, r.Token()); err != nil {
			t.Fatalf("reader's token %d: %v", r.Token(), err)
		}
	}
	s5, s6 := newSession(t, cli), newSession(t, cli)
	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go s5.Lock(wctx, rname) // a writer, waiting behind the readers
	writer := keyOf(t, cli, rname, s5)
	go s6.RLock(wctx, rname) // a reader, behind the writer
	reader := keyOf(t, cli, rname, s6)
	wantUnverified(t, v.Verify(ctx, rname, writer), rname, writer, fmt.Sprintf("%s/%x", rname, int64(s5.Lease())), r1.Key())
	wantUnverified(t, v.Verify(ctx, rname, reader), rname, reader, fmt.Sprintf("%s/%x", rname, int64(s6.Lease())), fmt.Sprintf("%s/%x", rname, int64(s5.Lease())))
	stopWaiting()

	// Someone's put moves a lock key off its lease: no holding's any more.
	dname := etcdproc.Name(t, "detached")
	d, err := s2.Lock(ctx, dname)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, d.Key(), ""); err != nil {
		t.Fatal(err)
	}
	err = v.Verify(ctx, dname, d.Token())
	wantUnverified(t, err, dname, d.Token(), d.Key())
	if ue := (*fence.UnverifiedError)(nil); !errors.As(err, &ue) || !ue.Detached {
		t.Fatalf("detached key: %v", err)
	}

	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantUnverified(t, v.Verify(ctx, name, l1.Token()), name, l1.Token(), "")
	l2 := <-granted
	if err := v.Verify(ctx, name, waiter); err != nil || l2 == nil || l2.Token() != waiter {
		t.Fatalf("the waiter, granted (%v): %v", l2, err)
	}

	for _, tc := range []struct {
		name  string
		token int64
	}{{"", 5}, {name, 0}, {name, -1}} {
		if err := v.Verify(ctx, tc.name, tc.token); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("Verify(%q, %d) = %v, want ErrInvalidArgument", tc.name, tc.token, err)
		}
	}
}

// deadClient is a client of an address nothing listens on.
func deadClient(t *testing.T) *clientv3.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A verifier that cannot reach etcd says so, within its timeout, and
// never as a refusal of the token: the fence must answer "unknown".
func TestEtcdVerifierUnavailable(t *testing.T) {
	etcdproc.LeakCheck(t)
	v := verifier(t, deadClient(t), fencestore.WithReadTimeout(300*time.Millisecond))
	start := time.Now()
	err := v.Verify(etcdproc.Ctx(t, 30*time.Second), "jobs", 42)
	if !errors.Is(err, fencestore.ErrVerifierUnavailable) || errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("err = %v, want ErrVerifierUnavailable", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v with a 300ms read timeout", took)
	}
	// An EtcdStore that cannot reach etcd: unavailable, not unverified.
	dead := deadClient(t)
	store, err := fencestore.NewEtcdStore(dead, "records/", fencestore.WithVerifier(verifier(t, dead, fencestore.WithReadTimeout(300*time.Millisecond))))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Accept(etcdproc.Ctx(t, 30*time.Second), "jobs", 42); !errors.Is(err, fencestore.ErrVerifierUnavailable) || errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("store: err = %v, want ErrVerifierUnavailable", err)
	}
	if _, err := fencestore.NewEtcdVerifier(nil); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewEtcdVerifier(nil): %v", err)
	}
	if _, err := fencestore.NewEtcdVerifier(deadClient(t), fencestore.WithReadTimeout(0)); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("WithReadTimeout(0): %v", err)
	}
}

// countingVerifier counts the reads of the real verifier it wraps.
type countingVerifier struct {
	fencestore.Verifier
	reads atomic.Int64
}

func (c *countingVerifier) Verify(ctx context.Context, name string, token int64) error {
	c.reads.Add(1)
	return c.Verifier.Verify(ctx, name, token)
}

// A MemoryStore's fence asks etcd once per holding: not again for the
// same token, not for a token at or below the highest accepted; a forged
// token is refused and raises nothing, and the holder goes on.
func TestVerificationReadsOncePerHolding(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "shard")
	store := fencestore.NewMemoryStore()
	cv := &countingVerifier{Verifier: verifier(t, cli)}
	x, err := fencestore.NewVerification(store, cv)
	if err != nil {
		t.Fatal(err)
	}
	accept := func(token int64) error {
		c := fencestore.Claim{Name: name, Token: token}
		if err := x.Check(ctx, c); err != nil {
			return err
		}
		return store.Accept(ctx, name, token)
	}
	s := newSession(t, cli)
	l1, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := accept(l1.Token()); err != nil {
			t.Fatalf("holder's request %d: %v", i, err)
		}
	}
	if n := cv.reads.Load(); n != 1 {
		t.Fatalf("%d reads for one holding's 5 requests, want 1", n)
	}
	wantUnverified(t, accept(forged), name, forged, "")
	if h := store.Highest(name); h != l1.Token() {
		t.Fatalf("highest %d after a forged token, want %d", h, l1.Token())
	}
	if err := accept(l1.Token()); err != nil {
		t.Fatalf("holder after the forged token: %v", err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	before := cv.reads.Load()
	if err := accept(l2.Token()); err != nil {
		t.Fatalf("next holding: %v", err)
	}
	// The first holding's token is now below the highest: stale, decided
	// by the store with no read, though its key is gone.
	var se *fence.StaleError
	if err := accept(l1.Token()); !errors.As(err, &se) {
		t.Fatalf("old holding's token: %v, want stale", err)
	}
	if n := cv.reads.Load() - before; n != 1 {
		t.Fatalf("%d reads for the next holding and a stale token, want 1", n)
	}
	if _, err := fencestore.NewVerification(nil, cv); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewVerification(nil store): %v", err)
	}
}

// countingKV counts the requests sent through the real client it wraps.
type countingKV struct {
	clientv3.KV
	gets, txns atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.gets.Add(1)
	return c.KV.Get(ctx, key, opts...)
}

func (c *countingKV) Txn(ctx context.Context) clientv3.Txn {
	c.txns.Add(1)
	return c.KV.Txn(ctx)
}

// An EtcdStore verifies by default, with its own client: a forged or a
// released holding's token is refused and the record stays; the holder's
// requests cost the store one read (its record and the lock keys together),
// once, then one transaction each, as without verification.
func TestEtcdStoreVerifies(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "ledger")
	kv := &countingKV{KV: cli}
	store, err := fencestore.NewEtcdStore(kv, etcdproc.Name(t, "records")+"/")
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, cli)
	l, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// The same requests through a store without verification, beside it.
	plainKV := &countingKV{KV: cli}
	plain, err := fencestore.NewEtcdStore(plainKV, etcdproc.Name(t, "plain")+"/", fencestore.WithoutVerifier())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := store.Accept(ctx, name, l.Token()); err != nil {
			t.Fatalf("holder's request %d: %v", i, err)
		}
		if err := plain.Accept(ctx, name, l.Token()); err != nil {
			t.Fatalf("unverified store, request %d: %v", i, err)
		}
	}
	// One read-only transaction more: the record and the lock keys, read
	// together once.
	if g, x, px := kv.gets.Load(), kv.txns.Load(), plainKV.txns.Load(); g != 0 || x != px+1 || plainKV.gets.Load() != 0 {
		t.Fatalf("%d reads and %d transactions for 5 requests, want none and the unverified store's %d + 1", g, x, px)
	}
	wantUnverified(t, store.Accept(ctx, name, forged), name, forged, "")
	if h, err := fence.ReadRecord(ctx, cli, store.Key(name)); err != nil || h != l.Token() {
		t.Fatalf("record after a forged token: %d %v, want %d", h, err, l.Token())
	}
	if err := store.Accept(ctx, name, l.Token()); err != nil {
		t.Fatalf("holder after the forged token: %v", err)
	}

	// A holding released before its first request: its key is gone.
	released := etcdproc.Name(t, "released")
	r, err := s.Lock(ctx, released)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantUnverified(t, store.Accept(ctx, released, r.Token()), released, r.Token(), "")
	if err := store.Verify(ctx, fencestore.Claim{Name: released, Token: r.Token()}); !errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("Verify of the released token: %v", err)
	}

	// Opting out restores the old behaviour: any number that is not stale.
	open, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "open")+"/", fencestore.WithoutVerifier())
	if err != nil {
		t.Fatal(err)
	}
	if err := open.Accept(ctx, name, forged); err != nil {
		t.Fatalf("WithoutVerifier: %v", err)
	}
	for _, opts := range [][]fencestore.StoreOption{
		{fencestore.WithVerifier(nil)},
		{fencestore.WithoutVerifier(), fencestore.WithVerifier(verifier(t, cli))},
		{nil},
	} {
		if _, err := fencestore.NewEtcdStore(cli, "p/", opts...); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("NewEtcdStore with %d bad options: %v", len(opts), err)
		}
	}
}

// Check over an EtcdStore leaves verification to the store's Accept, which
// verifies with the same Verify, rather than ask twice; with the handler's
// write as the check (InHandler) it verifies itself. A forged token is
// refused either way and the record stays.
func TestCheckVerifiesOnceOverEtcdStore(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "once")
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/")
	if err != nil {
		t.Fatal(err)
	}
	own, err := fencestore.VerifyFunc(store, nil)
	if err != nil || own == nil {
		t.Fatalf("VerifyFunc of an EtcdStore: %v, %v", own != nil, err)
	}
	calls := 0
	counted := func(ctx context.Context, c fencestore.Claim) error {
		calls++
		return own(ctx, c)
	}
	l, err := newSession(t, cli).Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	check := func(token int64, inHandler bool) error {
		_, _, err := fencestore.Check(ctx, store, fencestore.Request{
			Lock:      func() string { return name },
			Read:      func() (fencestore.Claim, error) { return fencestore.Claim{Name: name, Token: token}, nil },
			InHandler: inHandler,
			ClaimKey:  "claim",
			Bad:       func(reason string) error { return errors.New(reason) },
			Verify:    counted,
		})
		return err
	}
	if err := check(l.Token(), false); err != nil || calls != 0 {
		t.Fatalf("holder through the store: %v, %d calls of Request.Verify, want none (Accept verifies)", err, calls)
	}
	wantUnverified(t, check(forged, false), name, forged, "")
	if calls != 0 {
		t.Fatalf("%d calls of Request.Verify for a forged token, want none", calls)
	}
	if h, err := fence.ReadRecord(ctx, cli, store.Key(name)); err != nil || h != l.Token() {
		t.Fatalf("record after a forged token: %d %v, want %d", h, err, l.Token())
	}
	if err := check(l.Token(), true); err != nil || calls != 1 {
		t.Fatalf("holder left to its handler: %v, %d calls of Request.Verify, want 1", err, calls)
	}
	wantUnverified(t, check(forged, true), name, forged, "")
}

// An EtcdStore made WithoutVerifier verifies nothing in Accept: a Verify
// given beside it (a Verification of another Verifier) still runs in
// Check, and refuses a forged token before the record is raised.
func TestCheckVerifiesBesideUnverifiedEtcdStore(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "beside")
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithoutVerifier())
	if err != nil {
		t.Fatal(err)
	}
	x, err := fencestore.NewVerification(store, verifier(t, cli))
	if err != nil {
		t.Fatal(err)
	}
	l, err := newSession(t, cli).Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	check := func(token int64) error {
		_, _, err := fencestore.Check(ctx, store, fencestore.Request{
			Lock:     func() string { return name },
			Read:     func() (fencestore.Claim, error) { return fencestore.Claim{Name: name, Token: token}, nil },
			ClaimKey: "claim",
			Bad:      func(reason string) error { return errors.New(reason) },
			Verify:   x.Check,
		})
		return err
	}
	if err := check(l.Token()); err != nil {
		t.Fatalf("holder: %v", err)
	}
	wantUnverified(t, check(forged), name, forged, "")
	if h, err := fence.ReadRecord(ctx, cli, store.Key(name)); err != nil || h != l.Token() {
		t.Fatalf("record after a forged token: %d %v, want %d", h, err, l.Token())
	}
}
