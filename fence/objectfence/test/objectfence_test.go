package objectfence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// mustClaim claims the manifest for token.
func mustClaim(t *testing.T, f *objectfence.Fence, token int64) objectfence.Manifest {
	t.Helper()
	m, err := f.Claim(testCtx(t), token)
	if err != nil {
		t.Fatalf("claim %d: %v", token, err)
	}
	return m
}

// mustCommit commits payload as a holder of token would: a claim, then a
// commit on what the claim returned.
func mustCommit(t *testing.T, f *objectfence.Fence, token int64, payload string) objectfence.Manifest {
	t.Helper()
	m, err := f.Commit(testCtx(t), mustClaim(t, f, token), []byte(payload))
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

// wantErr checks that err wraps want, is no StaleError, and names the
// package once.
func wantErr(t *testing.T, err, want error) {
	t.Helper()
	var se *fence.StaleError
	switch {
	case !errors.Is(err, want):
		t.Fatalf("err = %v, want %v", err, want)
	case errors.As(err, &se):
		t.Fatalf("err = %v: a StaleError, want %v", err, want)
	case strings.Count(err.Error(), "objectfence") != 1:
		t.Fatalf("%q names the package more than once", err)
	}
}

// wantManifest checks the manifest's token, lock name and payload.
func wantManifest(t *testing.T, f *objectfence.Fence, token int64, payload string) objectfence.Manifest {
	t.Helper()
	m, err := f.Read(testCtx(t))
	if err != nil || m.Token != token || m.Lock != lockName || string(m.Payload) != payload {
		t.Fatalf("manifest = %+v (payload %q), %v; want token %d of %q, %q", m, m.Payload, err, token, lockName, payload)
	}
	return m
}

func TestCommitOrdersByToken(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	if _, err := f.Read(ctx); !errors.Is(err, objectfence.ErrNotFound) {
		t.Fatalf("read before any commit: %v, want ErrNotFound", err)
	}
	b4 := mustClaim(t, f, 4) // no manifest yet: If-None-Match: *
	b5 := mustClaim(t, f, 5)
	_, err := f.Commit(ctx, b4, []byte("late"))
	wantStale(t, err, 4, 5)
	first, err := f.Commit(ctx, b5, []byte("batch-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.Commit(ctx, first, []byte("batch-2")) // the same holder again
	if err != nil || first.Version == again.Version {
		t.Fatalf("second commit = %+v, %v; versions %s, then %s", again, err, first.Version, again.Version)
	}
	_, err = f.Claim(ctx, 4)
	wantStale(t, err, 4, 5)
	mustCommit(t, f, 9, "batch-3")
	_, err = f.Commit(ctx, again, []byte("late"))
	wantStale(t, err, 5, 9)
	wantManifest(t, f, 9, "batch-3")
}

// The new holder's mistake: A (token 3) has committed batch-10 and has
// batch-20 in flight; B (token 6) takes over and reads the manifest with
// Read, not Claim. Whether A's late commit lands after B's read or not,
// B's commit on what it read is refused before anything is sent, and A's
// commit is not overwritten. B then claims and builds on what is there,
// and A's next commit is stale. (Before commits named their base, B's
// commit, with token 6, went through and moved the manifest back.)
func TestCommitOnReadIsRefused(t *testing.T) {
	for _, late := range []bool{true, false} {
		t.Run(fmt.Sprintf("late commit lands=%v", late), func(t *testing.T) {
			f, store, _ := newFence(t)
			ctx := testCtx(t)
			a := mustCommit(t, f, 3, "batch-10")
			counted := &counting{Store: store}
			b, err := objectfence.New(counted, f.Key(), lockName)
			if err != nil {
				t.Fatal(err)
			}
			read, err := b.Read(ctx)
			if err != nil || string(read.Payload) != "batch-10" {
				t.Fatalf("B's read: %+v, %v", read, err)
			}
			want := "batch-10"
			if late {
				if a, err = f.Commit(ctx, a, []byte("batch-20")); err != nil {
					t.Fatalf("A's late commit: %v", err)
				}
				want = "batch-20"
			}
			sent := counted.n.Load()
			_, err = b.Commit(ctx, read, []byte(string(read.Payload)+"+11"))
			wantErr(t, err, objectfence.ErrNotClaimed)
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("commit on a read manifest: %v, want it refused as bad input", err)
			}
			if n := counted.n.Load() - sent; n != 0 {
				t.Fatalf("the refused commit sent %d requests", n)
			}
			wantManifest(t, f, 3, want)
			base, err := b.Claim(ctx, 6)
			if err != nil || string(base.Payload) != want {
				t.Fatalf("B's claim = %+v, %v; want %q", base, err, want)
			}
			_, err = f.Commit(ctx, a, []byte("batch-30"))
			wantStale(t, err, 3, 6)
			if _, err := b.Commit(ctx, base, []byte(want+"+11")); err != nil {
				t.Fatalf("B's commit on its claim: %v", err)
			}
			wantManifest(t, f, 6, want+"+11")
		})
	}
}

// A commit lands only on the manifest version it names: once another
// commit has replaced its base, it is refused, even when the manifest has
// come back to the same payload since.
func TestCommitOnReplacedBaseIsRefused(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	commit := func(base objectfence.Manifest, payload string) objectfence.Manifest {
		t.Helper()
		m, err := f.Commit(ctx, base, []byte(payload))
		if err != nil {
			t.Fatalf("commit %q: %v", payload, err)
		}
		return m
	}
	b0 := mustClaim(t, f, 5)
	b1 := commit(b0, "batch-1")
	_, err := f.Commit(ctx, b0, []byte("batch-1b"))
	wantErr(t, err, objectfence.ErrNotClaimed)
	if errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("a replaced base refused as bad input: %v", err)
	}
	if m := wantManifest(t, f, 5, "batch-1"); m.Version != b1.Version {
		t.Fatalf("version %s, want %s", m.Version, b1.Version)
	}
	b2 := commit(b1, "batch-2")
	b3 := commit(b2, "batch-1") // the payload of b1 again
	_, err = f.Commit(ctx, b1, []byte("batch-x"))
	wantErr(t, err, objectfence.ErrNotClaimed)
	if m := wantManifest(t, f, 5, "batch-1"); m.Version != b3.Version {
		t.Fatalf("version %s, want %s", m.Version, b3.Version)
	}
	again := mustClaim(t, f, 5) // the holder's own token: nothing written
	if again.Version != b3.Version {
		t.Fatalf("a claim at the manifest's token wrote: version %s, then %s", b3.Version, again.Version)
	}
	commit(again, "batch-3")
	wantManifest(t, f, 5, "batch-3")
}

// Goroutines of one holding update the manifest at once, each appending
// its marks to the payload: a commit on a base that another commit
// replaced is refused, the goroutine claims again and retries, and no
// mark is lost.
func TestNoLostUpdates(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	const token, writers, marks = 7, 4, 5
	mustClaim(t, f, token)
	var wg sync.WaitGroup
	var refused atomic.Int32
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range marks {
				for {
					base, err := f.Claim(ctx, token)
					if err != nil {
						t.Errorf("claim: %v", err)
						return
					}
					_, err = f.Commit(ctx, base, []byte(fmt.Sprintf("%s%d.%d,", base.Payload, w, i)))
					if err == nil {
						break
					}
					if !errors.Is(err, objectfence.ErrNotClaimed) {
						t.Errorf("commit: %v", err)
						return
					}
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	m, err := f.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(m.Payload), ","), ",")
	slices.Sort(got)
	var want []string
	for w := range writers {
		for i := range marks {
			want = append(want, fmt.Sprintf("%d.%d", w, i))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("payload %q: marks %v, want %v", m.Payload, got, want)
	}
	t.Logf("%d commits refused on a replaced base, and retried", refused.Load())
}

// A manifest records the lock that fences it: a Fence of another lock
// name neither claims nor commits it, even with a higher token, and
// leaves it as it was.
func TestOtherLockIsRefused(t *testing.T) {
	f, store, _ := newFence(t)
	ctx := testCtx(t)
	base := mustCommit(t, f, 5, "batch-1")
	before := wantManifest(t, f, 5, "batch-1")
	g, err := objectfence.New(store, f.Key(), "tables/customers")
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Claim(ctx, 9)
	wantErr(t, err, objectfence.ErrOtherLock)
	if !strings.Contains(err.Error(), `"tables/customers"`) || !strings.Contains(err.Error(), `"tables/orders"`) {
		t.Fatalf("%q does not name both locks", err)
	}
	_, err = g.Commit(ctx, base, []byte("batch-x"))
	wantErr(t, err, objectfence.ErrOtherLock)
	_, err = g.Orphans(ctx, func(string) bool { return false })
	wantErr(t, err, objectfence.ErrOtherLock)
	if after := wantManifest(t, f, 5, "batch-1"); after.Version != before.Version {
		t.Fatalf("the refused writes changed the manifest: version %s, then %s", before.Version, after.Version)
	}
	if _, err := f.Commit(ctx, base, []byte("batch-2")); err != nil {
		t.Fatalf("the manifest's own lock: %v", err)
	}
}

// A manifest written before manifests recorded their lock reads as it
// is; the first claim, even at the token it already has, records the
// lock, and commits go on from there.
func TestOldFormatManifest(t *testing.T) {
	f, store, _ := newFence(t)
	ctx := testCtx(t)
	old := []byte(`{"token":4,"payload":"YmF0Y2gtMQ=="}`) // batch-1, as the earlier version wrote it
	if _, err := store.Put(ctx, f.Key(), old, objectfence.Condition{}); err != nil {
		t.Fatal(err)
	}
	m, err := f.Read(ctx)
	if err != nil || m.Token != 4 || m.Lock != "" || string(m.Payload) != "batch-1" {
		t.Fatalf("read of the old form = %+v, %v; want token 4, no lock, batch-1", m, err)
	}
	_, err = f.Claim(ctx, 3)
	wantStale(t, err, 3, 4)
	base, err := f.Claim(ctx, 4)
	if err != nil || base.Token != 4 || base.Lock != lockName || string(base.Payload) != "batch-1" {
		t.Fatalf("claim of the old form = %+v, %v", base, err)
	}
	body, _, err := store.Get(ctx, f.Key())
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Token int64  `json:"token"`
		Lock  string `json:"lock"`
	}
	if err := json.Unmarshal(body, &raw); err != nil || raw.Token != 4 || raw.Lock != lockName {
		t.Fatalf("the claimed manifest's object is %s (%v): no lock recorded", body, err)
	}
	if _, err := f.Commit(ctx, base, []byte("batch-2")); err != nil {
		t.Fatalf("commit on the claimed old form: %v", err)
	}
	wantManifest(t, f, 4, "batch-2")
}

func TestClaim(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	m, err := f.Claim(ctx, 4) // missing: made with no payload
	if err != nil || m.Token != 4 || m.Lock != lockName || len(m.Payload) != 0 {
		t.Fatalf("claim of a missing manifest = %+v, %v", m, err)
	}
	if _, err := f.Commit(ctx, m, []byte("batch-1")); err != nil {
		t.Fatal(err)
	}
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

// Holders with different tokens claim and commit at once, and a reader:
// the reader only ever sees the token go up, every commit that returned
// nil holds a token no lower than any commit acknowledged before it began,
// and the manifest ends with the highest token that committed.
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
			base, err := f.Claim(ctx, tok)
			for i := 0; err == nil && i < 8; i++ {
				start := time.Now()
				if base, err = f.Commit(ctx, base, []byte(fmt.Sprintf("%d-%d", tok, i))); err == nil {
					mu.Lock()
					acks = append(acks, ack{tok, start, time.Now()})
					mu.Unlock()
				}
			}
			if err != nil && !errors.Is(err, fence.ErrStale) { // stale: overtaken, as a real holder is once it lost its lock
				t.Errorf("holder %d: %v", tok, err)
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

// racer slips another holder's claim and commit in, through the real
// store, just before the fence's first put of the manifest: the put's
// condition then fails (412), and the fence must read again.
type racer struct {
	objectfence.Store
	other *objectfence.Fence
	token int64
	once  sync.Once
	err   error
}

func (r *racer) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	if key == r.other.Key() && (cond.IfMatch != "" || cond.IfAbsent) {
		r.once.Do(func() {
			var m objectfence.Manifest
			if m, r.err = r.other.Claim(ctx, r.token); r.err == nil {
				_, r.err = r.other.Commit(ctx, m, []byte("racer"))
			}
		})
	}
	return r.Store.Put(ctx, key, body, cond)
}

func TestRetryAfterFailedCondition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit bool  // a commit on a claim of token 10; else the claim
		racer  int64 // the token of the writer that slips in
		want   error
	}{
		{"claim: a lower holder slips in: read again, claimed with its payload", false, 7, nil},
		{"claim: a higher holder slips in: stale", false, 12, fence.ErrStale},
		{"commit: a higher holder slips in: stale", true, 12, fence.ErrStale},
		{"commit: another commit of the holding slips in: refused", true, 10, objectfence.ErrNotClaimed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain, store, _ := newFence(t)
			ctx := testCtx(t)
			mustCommit(t, plain, 5, "batch-1")
			r := &racer{Store: store, other: plain, token: tc.racer}
			f, err := objectfence.New(r, plain.Key(), lockName)
			if err != nil {
				t.Fatal(err)
			}
			if tc.commit {
				_, err = f.Commit(ctx, mustClaim(t, plain, 10), []byte("batch-2"))
			} else {
				_, err = f.Claim(ctx, 10)
			}
			if r.err != nil {
				t.Fatalf("the racing holder: %v", r.err)
			}
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			wantManifest(t, plain, max(tc.racer, 10), "racer")
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
	base := mustClaim(t, plain, 6)
	f, err := objectfence.New(&stopper{Store: store, srv: srv, key: plain.Key()}, plain.Key(), lockName)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = f.Commit(cctx, base, []byte("batch-2"))
	cancel()
	srv.Signal(syscall.SIGCONT)
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("commit with the gateway stopped = %v, want ErrOutcomeUnknown", err)
	}
	m, err := plain.Read(ctx)
	if err != nil || m.Token != 6 || (string(m.Payload) != "batch-1" && string(m.Payload) != "batch-2") {
		t.Fatalf("after an unknown outcome: %+v, %v", m, err)
	}
	t.Logf("the put that timed out did %s", map[bool]string{true: "land", false: "not land"}[string(m.Payload) == "batch-2"])
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
	f, err := objectfence.New(store, "m", lockName)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	err = f.Check(ctx)
	if !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("check = %v, want ErrConditionsIgnored", err)
	}
	t.Logf("s3rver %s: %v", s3test.S3rverVersion, err)
	if _, err := f.Claim(ctx, 1); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("claim on such a store = %v, want ErrConditionsIgnored", err)
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
