package objectfence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

func mustCommit(t *testing.T, f *objectfence.Fence, token int64, payload string) objectfence.Manifest {
	t.Helper()
	m, err := f.Commit(testCtx(t), token, []byte(payload))
	if err != nil {
		t.Fatalf("commit %d: %v", token, err)
	}
	return m
}

func wantStale(t *testing.T, err error, token, highest int64) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Token != token || se.Highest != highest {
		t.Fatalf("err = %v, want a StaleError of %d under %d", err, token, highest)
	}
}

func TestCommitOrdersByToken(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	if _, err := f.Read(ctx); !errors.Is(err, objectfence.ErrNotFound) {
		t.Fatalf("read before any commit: %v, want ErrNotFound", err)
	}
	first := mustCommit(t, f, 5, "batch-1") // no manifest yet: If-None-Match: *
	again := mustCommit(t, f, 5, "batch-2") // the same holder again
	if first.Version == again.Version {
		t.Fatalf("two commits left the same version %s", first.Version)
	}
	_, err := f.Commit(ctx, 4, []byte("late"))
	wantStale(t, err, 4, 5)
	mustCommit(t, f, 9, "batch-3")
	_, err = f.Commit(ctx, 5, []byte("late"))
	wantStale(t, err, 5, 9)
	m, err := f.Read(ctx)
	if err != nil || m.Token != 9 || string(m.Payload) != "batch-3" {
		t.Fatalf("read = %+v, %v; want token 9, batch-3", m, err)
	}
}

// The gap a claim closes: A (token 3) committed batch-10 and has batch-20
// in flight; B (token 6) takes over and reads. With a plain read the late
// commit lands after B's read and B's next commit, built on batch-10,
// moves the manifest back; with a claim it is refused.
func TestClaimKeepsLateCommitOut(t *testing.T) {
	for _, claim := range []bool{false, true} {
		t.Run(fmt.Sprintf("claim=%v", claim), func(t *testing.T) {
			f, _, _ := newFence(t)
			ctx := testCtx(t)
			mustCommit(t, f, 3, "batch-10")
			var read objectfence.Manifest
			var err error
			if claim {
				read, err = f.Claim(ctx, 6)
			} else {
				read, err = f.Read(ctx)
			}
			if err != nil || string(read.Payload) != "batch-10" {
				t.Fatalf("B's read: %+v, %v", read, err)
			}
			_, late := f.Commit(ctx, 3, []byte("batch-20"))
			if claim {
				wantStale(t, late, 3, 6)
			} else if late != nil {
				t.Fatalf("late commit without a claim: %v, want it through (the gap)", late)
			}
			mustCommit(t, f, 6, string(read.Payload)+"+11")
			m, err := f.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := "batch-10+11"; string(m.Payload) != want {
				t.Fatalf("manifest %q, want %q", m.Payload, want)
			}
		})
	}
}

func TestClaim(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	m, err := f.Claim(ctx, 4) // missing: made with no payload
	if err != nil || m.Token != 4 || len(m.Payload) != 0 {
		t.Fatalf("claim of a missing manifest = %+v, %v", m, err)
	}
	mustCommit(t, f, 4, "batch-1")
	again, err := f.Claim(ctx, 4)
	if err != nil || string(again.Payload) != "batch-1" {
		t.Fatalf("claim at the manifest's token = %+v, %v", again, err)
	}
	if cur, _ := f.Read(ctx); cur.Version != again.Version {
		t.Fatalf("a claim at the same token wrote: version %s, then %s", again.Version, cur.Version)
	}
	_, err = f.Claim(ctx, 3)
	wantStale(t, err, 3, 4)
	up, err := f.Claim(ctx, 8)
	if err != nil || up.Token != 8 || string(up.Payload) != "batch-1" {
		t.Fatalf("higher claim = %+v, %v; want token 8 with batch-1", up, err)
	}
}

// Committers with different tokens at once, and a reader: the reader only
// ever sees the token go up, every commit that returned nil holds a token
// no lower than any commit acknowledged before it began, and the manifest
// ends with the highest token that committed.
func TestConcurrentCommitters(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	type ack struct {
		token      int64
		start, end time.Time
	}
	var (
		mu   sync.Mutex
		acks []ack
		wg   sync.WaitGroup
	)
	tokens := []int64{11, 12, 13, 14, 15, 16}
	for _, tok := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				start := time.Now()
				_, err := f.Commit(ctx, tok, []byte(fmt.Sprintf("%d-%d", tok, i)))
				switch {
				case err == nil:
					mu.Lock()
					acks = append(acks, ack{tok, start, time.Now()})
					mu.Unlock()
				case errors.Is(err, fence.ErrStale):
					return // overtaken: a real holder would have lost its lock
				default:
					t.Errorf("commit %d: %v", tok, err)
					return
				}
			}
		}()
	}
	stop, done := make(chan struct{}), make(chan struct{})
	var seen []int64
	go func() {
		defer close(done)
		for {
			if m, err := f.Read(ctx); err == nil {
				seen = append(seen, m.Token)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	if len(acks) == 0 {
		t.Fatal("no commit went through")
	}
	if !slices.IsSorted(seen) {
		t.Errorf("the reader saw the token go down: %v", seen)
	}
	for _, a := range acks {
		for _, b := range acks {
			if b.end.Before(a.start) && b.token > a.token {
				t.Errorf("commit %d acknowledged after commit %d had been", a.token, b.token)
			}
		}
	}
	m, err := f.Read(ctx)
	top := slices.MaxFunc(acks, func(a, b ack) int { return int(a.token - b.token) })
	if err != nil || m.Token != top.token {
		t.Errorf("manifest token %d (%v), want %d", m.Token, err, top.token)
	}
	t.Logf("%d commits acknowledged, reader saw %d states", len(acks), len(seen))
}

// racer commits another writer's manifest through the real store just
// before the fence's own put, once: the put's condition then fails (412)
// and the fence must read again.
type racer struct {
	objectfence.Store
	other *objectfence.Fence
	token int64
	once  sync.Once
	err   error
}

func (r *racer) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	if key == r.other.Key() && (cond.IfMatch != "" || cond.IfAbsent) {
		r.once.Do(func() { _, r.err = r.other.Commit(ctx, r.token, []byte("racer")) })
	}
	return r.Store.Put(ctx, key, body, cond)
}

func TestRetryAfterFailedCondition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		racer  int64 // the token of the write that slips in
		commit error // want
	}{
		{"a lower write slips in: retried and committed", 7, nil},
		{"a higher write slips in: stale", 12, fence.ErrStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain, store, _ := newFence(t)
			ctx := testCtx(t)
			mustCommit(t, plain, 5, "batch-1")
			r := &racer{Store: store, other: plain, token: tc.racer}
			f, err := objectfence.New(r, plain.Key())
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.Commit(ctx, 10, []byte("batch-2"))
			if r.err != nil {
				t.Fatalf("the racing write: %v", r.err)
			}
			if !errors.Is(err, tc.commit) || (tc.commit == nil && err != nil) {
				t.Fatalf("commit = %v, want %v", err, tc.commit)
			}
			m, _ := plain.Read(ctx)
			if want := max(tc.racer, 10); tc.commit == nil && m.Token != want {
				t.Fatalf("manifest token %d, want %d", m.Token, want)
			}
		})
	}
}

// stopper pauses the gateway (SIGSTOP) as the fence's manifest put begins:
// the put then times out with its outcome unknown.
type stopper struct {
	objectfence.Store
	srv  *s3test.Server
	key  string
	once sync.Once
}

func (s *stopper) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	if key == s.key {
		s.once.Do(func() { s.srv.Signal(syscall.SIGSTOP) })
	}
	return s.Store.Put(ctx, key, body, cond)
}

func TestOutcomeUnknownIsNotRetried(t *testing.T) {
	plain, store, srv := newFence(t)
	ctx := testCtx(t)
	mustCommit(t, plain, 5, "batch-1")
	f, err := objectfence.New(&stopper{Store: store, srv: srv, key: plain.Key()}, plain.Key())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = f.Commit(cctx, 6, []byte("batch-2"))
	cancel()
	srv.Signal(syscall.SIGCONT)
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("commit with the gateway stopped = %v, want ErrOutcomeUnknown", err)
	}
	m, err := plain.Read(ctx)
	if err != nil || (m.Token != 5 && m.Token != 6) {
		t.Fatalf("after an unknown outcome: %+v, %v", m, err)
	}
	t.Logf("the put that timed out did %s", map[bool]string{true: "land", false: "not land"}[m.Token == 6])
}

func TestOrphans(t *testing.T) {
	f, store, _ := newFence(t)
	ctx := testCtx(t)
	put := func(token int64, name string) string {
		k, err := f.DataKey(token, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Put(ctx, k, []byte(name), objectfence.Condition{}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	if got, err := f.Orphans(ctx, func(string) bool { return false }); err != nil || got != nil {
		t.Fatalf("orphans with no manifest = %v, %v; want none", got, err)
	}
	a1 := put(1, "part-a")
	b2 := put(2, "part-b")
	c2 := put(2, "part-c") // written by token 2, never committed
	mustCommit(t, f, 2, b2)
	d3 := put(3, "part-d") // token 3's batch, in flight
	if _, err := store.Put(ctx, "tables/orders/manifest.data/not-a-token/x", nil, objectfence.Condition{}); err != nil {
		t.Fatal(err)
	}
	referenced := func(k string) bool { return k == b2 }
	got, err := f.Orphans(ctx, referenced)
	if err != nil || !slices.Equal(got, []string{a1}) {
		t.Fatalf("orphans at token 2 = %v, %v; want %v", got, err, []string{a1})
	}
	mustCommit(t, f, 3, d3)
	got, _ = f.Orphans(ctx, func(k string) bool { return k == d3 })
	slices.Sort(got)
	if want := []string{a1, b2, c2}; !slices.Equal(got, want) {
		t.Fatalf("orphans at token 3 = %v, want %v", got, want)
	}
}

// s3rver, an emulator from before S3 had conditional writes, writes every
// put whatever its condition: the check must refuse it, and so must every
// commit of the Fence after.
func TestCheckRefusesStoreThatIgnoresConditions(t *testing.T) {
	srv, bucket := s3test.StartS3rverT(t)
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	f, err := objectfence.New(store, "m")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	err = f.Check(ctx)
	if !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("check = %v, want ErrConditionsIgnored", err)
	}
	t.Logf("s3rver %s: %v", s3test.S3rverVersion, err)
	if _, err := f.Commit(ctx, 1, []byte("x")); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("commit on such a store = %v, want ErrConditionsIgnored", err)
	}
	if _, err := f.Read(ctx); !errors.Is(err, objectfence.ErrNotFound) {
		t.Fatalf("the refused commit wrote a manifest: %v", err)
	}
}

// versitygw's posix backend honours every condition the check tries.
func TestCheckPassesVersitygw(t *testing.T) {
	f, store, _ := newFence(t, objectfence.WithProbePrefix("probes/p-"))
	ctx := testCtx(t)
	if err := f.Check(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	if left, err := store.List(ctx, "probes/"); err != nil || len(left) != 0 {
		t.Fatalf("probe objects left: %v, %v", left, err)
	}
}
