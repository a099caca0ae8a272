package fencegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// wantStale checks that err is a stale refusal naming both tokens: a
// *fence.StaleError for errors.As, and Aborted for gRPC.
func wantStale(t *testing.T, err error, name string, token, highest int64) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Key != name || se.Token != token || se.Highest != highest {
		t.Fatalf("err = %v, want a stale refusal of %d at %q by %d", err, token, name, highest)
	}
	if !errors.Is(err, fence.ErrStale) || status.Code(err) != codes.Aborted {
		t.Fatalf("err = %v (code %v), want fence.ErrStale and Aborted", err, status.Code(err))
	}
}

// Two holders in turn, then the first one's late call: refused with
// Aborted naming both tokens, for unary calls and both kinds of stream, and
// the handler never runs for it.
func TestStaleCallRefused(t *testing.T) {
	for kind, mk := range stores() {
		t.Run(kind, func(t *testing.T) {
			etcdproc.LeakCheck(t)
			sk := mk(t)
			var refused []string
			hooks := &fence.Hooks{Refused: func(g string) { refused = append(refused, g) }}
			l := &ledger{}
			cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithHooks(hooks)})
			ctx := etcdproc.Ctx(t, 30*time.Second)
			a, b := holder{"ledger", 5}, holder{"ledger", 6}
			if _, err := cl.UnaryCall(ctx, request("a1"), fencegrpc.WithHolder(a)); err != nil {
				t.Fatal(err)
			}
			if _, err := cl.UnaryCall(ctx, request("b1"), fencegrpc.WithHolder(b)); err != nil {
				t.Fatal(err)
			}
			_, err := cl.UnaryCall(ctx, request("a2"), fencegrpc.WithHolder(a))
			wantStale(t, err, "ledger", 5, 6)

			in, err := cl.StreamingInputCall(ctx, fencegrpc.WithHolder(a))
			if err == nil {
				in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: []byte("a3")}})
				_, err = in.CloseAndRecv()
			}
			wantStale(t, err, "ledger", 5, 6)

			duplex, err := cl.FullDuplexCall(ctx, fencegrpc.WithHolder(a))
			if err == nil {
				_, err = duplex.Recv()
			}
			wantStale(t, err, "ledger", 5, 6)

			entries, calls := l.snapshot()
			if calls != 2 || len(entries) != 2 || entries[1].body != "b1" {
				t.Fatalf("ledger %v after %d handler runs, want a1 b1 after 2", entries, calls)
			}
			if h := sk.highest("ledger"); h != 6 {
				t.Errorf("highest = %d, want 6", h)
			}
			if fmt.Sprint(refused) != "[grpc grpc grpc]" {
				t.Errorf("hooks saw %v, want three grpc refusals", refused)
			}
		})
	}
}

// A stream that passed its check appends every message under its claim.
func TestStreamsCarryTheClaim(t *testing.T) {
	etcdproc.LeakCheck(t)
	l := &ledger{}
	cl := serve(t, l, fencestore.NewMemoryStore(), []fencegrpc.Option{fencegrpc.WithLockName("ledger")}, fencegrpc.WithHolder(holder{"ledger", 9}))
	ctx := etcdproc.Ctx(t, 30*time.Second)
	in, err := cl.StreamingInputCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"x", "y"} {
		if err := in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: []byte(b)}}); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := in.CloseAndRecv(); err != nil || resp.GetAggregatedPayloadSize() != 2 {
		t.Fatalf("CloseAndRecv = %v, %v", resp, err)
	}
	duplex, err := cl.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := duplex.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("z")}}); err != nil {
		t.Fatal(err)
	}
	if m, err := duplex.Recv(); err != nil || string(m.GetPayload().GetBody()) != "z" {
		t.Fatalf("Recv = %v, %v", m, err)
	}
	duplex.CloseSend()
	entries, _ := l.snapshot()
	want := []entry{{fencestore.Claim{Name: "ledger", Token: 9}, "x"}, {fencestore.Claim{Name: "ledger", Token: 9}, "y"}, {fencestore.Claim{Name: "ledger", Token: 9}, "z"}}
	if !slices.Equal(entries, want) {
		t.Fatalf("ledger %v, want %v", entries, want)
	}
}

// Malformed, missing or misdirected metadata is refused with
// InvalidArgument before the handler runs, and the store does not move.
func TestBadMetadataRefused(t *testing.T) {
	cases := []struct {
		name   string
		method string // methodUnary if empty
		md     []string
		want   string // in the status message
	}{
		{name: "missing", want: "leasefence-lock is missing"},
		{name: "token missing", md: []string{"leasefence-lock", "ledger"}, want: "leasefence-token is missing"},
		{name: "lock repeated", md: []string{"leasefence-lock", "ledger", "leasefence-lock", "ledger", "leasefence-token", "7"}, want: "given 2 times"},
		{name: "token repeated", md: []string{"leasefence-lock", "ledger", "leasefence-token", "7", "leasefence-token", "7"}, want: "given 2 times"},
		{name: "leading zero", md: []string{"leasefence-lock", "ledger", "leasefence-token", "007"}, want: "leading zeros"},
		{name: "zero", md: []string{"leasefence-lock", "ledger", "leasefence-token", "0"}, want: "leading zeros"},
		{name: "negative", md: []string{"leasefence-lock", "ledger", "leasefence-token", "-1"}, want: "only decimal digits"},
		{name: "space", md: []string{"leasefence-lock", "ledger", "leasefence-token", " 5"}, want: "only decimal digits"},
		{name: "hex", md: []string{"leasefence-lock", "ledger", "leasefence-token", "0x10"}, want: "only decimal digits"},
		{name: "overflow", md: []string{"leasefence-lock", "ledger", "leasefence-token", "9223372036854775808"}, want: "overflows"},
		{name: "empty token", md: []string{"leasefence-lock", "ledger", "leasefence-token", ""}, want: "is empty"},
		{name: "wrong lock", md: []string{"leasefence-lock", "other", "leasefence-token", "7"}, want: `fenced by "ledger"`},
		{name: "claim true", md: []string{"leasefence-lock", "ledger", "leasefence-token", "7", "leasefence-claim", "true"}, want: `the only value is "1"`},
		{name: "claim repeated", md: []string{"leasefence-lock", "ledger", "leasefence-token", "7", "leasefence-claim", "1", "leasefence-claim", "1"}, want: "given 2 times"},
		{name: "claim alone", md: []string{"leasefence-claim", "1"}, want: "leasefence-lock is missing"},
		{name: "claim on unchecked method, no keys", method: methodEmpty, md: []string{"leasefence-claim", "1"}, want: "leasefence-lock is missing"},
		{name: "claim on unfenced method", method: methodUnfencedRPC, md: []string{"leasefence-lock", "ledger", "leasefence-token", "7", "leasefence-claim", "1"}, want: "does not fence"},
	}
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	byMethod := func(_ context.Context, m string, _ any) string {
		if m == methodUnfencedRPC {
			return ""
		}
		return "ledger"
	}
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockNameFunc(byMethod), fencegrpc.WithUncheckedMethods(methodEmpty)})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := metadata.NewOutgoingContext(etcdproc.Ctx(t, 30*time.Second), metadata.Pairs(tc.md...))
			var err error
			switch tc.method {
			case methodEmpty:
				_, err = cl.EmptyCall(ctx, &testpb.Empty{})
			case methodUnfencedRPC:
				_, err = cl.CacheableUnaryCall(ctx, request("x"))
			default:
				_, err = cl.UnaryCall(ctx, request("x"))
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("err = %v, want InvalidArgument saying %q", err, tc.want)
			}
			if _, calls := l.snapshot(); calls != 0 {
				t.Fatal("the handler ran")
			}
			if h := store.Highest("ledger"); h != 0 {
				t.Fatalf("highest = %d, want 0", h)
			}
		})
	}
}

// An unchecked method passes without a token; the same method carrying a
// claim is checked and its token recorded. An unfenced method (no lock
// name) passes whatever it carries, but for a claim.
func TestUncheckedMethodPasses(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithUncheckedMethods(methodEmpty)})
	ctx := etcdproc.Ctx(t, 30*time.Second)
	if _, err := cl.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("unchecked call with no token: %v", err)
	}
	if _, err := cl.EmptyCall(ctx, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 4}), fencegrpc.WithClaim()); err != nil {
		t.Fatalf("claim on an unchecked method: %v", err)
	}
	if h := store.Highest("ledger"); h != 4 {
		t.Fatalf("highest after the claim = %d, want 4", h)
	}
	_, err := cl.EmptyCall(ctx, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 3}), fencegrpc.WithClaim())
	wantStale(t, err, "ledger", 3, 4)
	if _, err := cl.UnaryCall(ctx, request("x")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("checked call with no token: %v, want InvalidArgument", err)
	}
	if _, calls := l.snapshot(); calls != 2 {
		t.Fatalf("handler ran %d times, want 2", calls)
	}
}

// With WithCheckInHandler, a call that passed the interceptor while token 6
// had not yet been accepted is refused at its write, which goes through
// the Store's atomic step after 6's: the ledger keeps 6's entry last.
func TestHandlerWriteAtomicWithCheck(t *testing.T) {
	for kind, mk := range stores() {
		t.Run(kind, func(t *testing.T) {
			etcdproc.LeakCheck(t)
			sk := mk(t)
			passed, release := make(chan struct{}), make(chan struct{})
			l := &ledger{write: sk.write, hold: func(c fencestore.Claim) {
				if c.Token == 5 {
					close(passed)
					<-release
				}
			}}
			cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler()})
			ctx := etcdproc.Ctx(t, 30*time.Second)
			slow := make(chan error, 1)
			go func() {
				_, err := cl.UnaryCall(ctx, request("a"), fencegrpc.WithHolder(holder{"ledger", 5}))
				slow <- err
			}()
			<-passed
			if _, err := cl.UnaryCall(ctx, request("b"), fencegrpc.WithHolder(holder{"ledger", 6})); err != nil {
				t.Fatal(err)
			}
			close(release)
			wantStale(t, <-slow, "ledger", 5, 6)
			if got := sk.applied(l); !slices.Equal(got, []int64{6}) {
				t.Fatalf("writes applied: %v, want [6]", got)
			}
		})
	}
}

// Concurrent calls of many holders, sent in and out of token order, each
// written through the Store's atomic step: the writes the resource applied
// never go back in token order, every refusal names a higher token that
// was accepted before it, and the highest token accepted is recorded.
func TestConcurrentCalls(t *testing.T) {
	for kind, mk := range stores() {
		t.Run(kind, func(t *testing.T) {
			etcdproc.LeakCheck(t)
			sk := mk(t)
			l := &ledger{write: sk.write}
			cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler()})
			ctx := etcdproc.Ctx(t, 30*time.Second)
			rng := rand.New(rand.NewSource(1))
			const callers, calls = 8, 12
			var mu sync.Mutex
			var accepted []int64
			var wg sync.WaitGroup
			for i := 0; i < callers; i++ {
				toks := make([]int64, calls)
				for j := range toks {
					toks[j] = int64(1 + rng.Intn(20))
				}
				if i%2 == 0 {
					slices.Sort(toks) // in token order
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, tok := range toks {
						_, err := cl.UnaryCall(ctx, request("w"), fencegrpc.WithHolder(holder{"ledger", tok}))
						var se *fence.StaleError
						switch {
						case err == nil:
							mu.Lock()
							accepted = append(accepted, tok)
							mu.Unlock()
						case errors.As(err, &se):
							if se.Highest <= tok {
								t.Errorf("token %d refused by %d", tok, se.Highest)
							}
						default:
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			got := sk.applied(l)
			if len(got) != len(accepted) {
				t.Fatalf("%d writes applied, %d acknowledged", len(got), len(accepted))
			}
			if !slices.IsSorted(got) {
				t.Fatalf("writes applied out of token order: %v", got)
			}
			if h := sk.highest("ledger"); h != slices.Max(accepted) {
				t.Fatalf("highest = %d, want %d", h, slices.Max(accepted))
			}
			if len(accepted) == callers*calls {
				t.Fatal("no call was refused: the test did not race")
			}
		})
	}
}

// storeFunc adapts a function to a Store: here, one that cannot answer,
// which a live etcd does not do on demand.
type storeFunc func(ctx context.Context, name string, token int64) error

func (f storeFunc) Accept(ctx context.Context, name string, token int64) error {
	return f(ctx, name, token)
}

// A check whose outcome is unknown fails with Unavailable, which a retry
// policy may retry: the handler has not run. The same error from the
// handler's own write is Unknown, which it must not.
func TestStoreFailure(t *testing.T) {
	etcdproc.LeakCheck(t)
	down := storeFunc(func(context.Context, string, int64) error {
		return fmt.Errorf("fence: commit: %w", fence.ErrOutcomeUnknown)
	})
	l := &ledger{}
	cl := serve(t, l, down, []fencegrpc.Option{fencegrpc.WithLockName("ledger")})
	_, err := cl.UnaryCall(etcdproc.Ctx(t, 30*time.Second), request("x"), fencegrpc.WithHolder(holder{"ledger", 1}))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if _, calls := l.snapshot(); calls != 0 {
		t.Fatal("the handler ran although the store failed")
	}
	l = &ledger{write: func(ctx context.Context, c fencestore.Claim, _ func() error) error { return down(ctx, c.Name, c.Token) }}
	cl = serve(t, l, down, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler()})
	_, err = cl.UnaryCall(etcdproc.Ctx(t, 30*time.Second), request("x"), fencegrpc.WithHolder(holder{"ledger", 1}))
	if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "outcome unknown") {
		t.Fatalf("handler's unknown outcome: %v, want Unknown", err)
	}
}
