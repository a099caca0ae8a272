package fencegrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A real lease lock as the connection's holder: its calls pass while it is
// held; once unlocked, the next call fails before anything is sent, with
// the lock's own reason.
func TestLeaseLockAsHolder(t *testing.T) {
	etcdproc.LeakCheck(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	s, err := lease.NewSession(ctx, etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := etcdproc.Name(t, "ledger")
	lock, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockName(name), fencegrpc.WithUncheckedMethods(methodEmpty)}, fencegrpc.WithHolder(lock))
	if _, err := cl.UnaryCall(ctx, request("x")); err != nil {
		t.Fatal(err)
	}
	if h := store.Highest(name); h != lock.Token() {
		t.Fatalf("highest = %d, want the lock's token %d", h, lock.Token())
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// EmptyCall is unchecked: had it been sent, its handler would run.
	_, err = cl.EmptyCall(ctx, &testpb.Empty{})
	if !errors.Is(err, fence.ErrNotHeld) || !errors.Is(err, lease.ErrUnlocked) || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("call after Unlock: %v (code %v), want ErrNotHeld, ErrUnlocked, FailedPrecondition", err, status.Code(err))
	}
	if _, calls := l.snapshot(); calls != 1 {
		t.Fatalf("%d handler runs, want 1: the call after Unlock was sent", calls)
	}
}

// Holders the client cannot send for are refused before sending, with
// InvalidArgument; per-call options override the connection's default.
func TestClientOptions(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithUncheckedMethods(methodEmpty)}, fencegrpc.WithHolder(holder{"ledger", 3}))
	ctx := etcdproc.Ctx(t, 30*time.Second)
	refused := []struct {
		name string
		opts []grpc.CallOption
	}{
		{"nil holder", []grpc.CallOption{fencegrpc.WithHolder(nil)}},
		{"zero token", []grpc.CallOption{fencegrpc.WithHolder(holder{"ledger", 0})}},
		{"non-ASCII name", []grpc.CallOption{fencegrpc.WithHolder(holder{"grüße", 3})}},
		{"claim without holder", []grpc.CallOption{fencegrpc.WithoutHolder(), fencegrpc.WithClaim()}},
	}
	for _, tc := range refused {
		_, err := cl.EmptyCall(ctx, &testpb.Empty{}, tc.opts...)
		if !errors.Is(err, fence.ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v (code %v), want fence.ErrInvalidArgument and InvalidArgument", tc.name, err, status.Code(err))
		}
	}
	if _, calls := l.snapshot(); calls != 0 {
		t.Fatalf("%d calls reached the server, want none", calls)
	}

	// The default holder, then a per-call one that overrides it.
	if _, err := cl.UnaryCall(ctx, request("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.UnaryCall(ctx, request("b"), fencegrpc.WithHolder(holder{"ledger", 8})); err != nil {
		t.Fatal(err)
	}
	_, err := cl.UnaryCall(ctx, request("c"))
	wantStale(t, err, "ledger", 3, 8)

	// Fencing keys already in the outgoing metadata (say, copied from an
	// incoming call) are replaced by the holder's, not sent twice.
	forwarded := metadata.AppendToOutgoingContext(ctx, fencegrpc.MetadataLock, "ledger", fencegrpc.MetadataToken, "99", "x-request-id", "r1")
	if _, err := cl.UnaryCall(forwarded, request("d"), fencegrpc.WithHolder(holder{"ledger", 8})); err != nil {
		t.Fatalf("call with forwarded keys: %v", err)
	}
	if h := store.Highest("ledger"); h != 8 {
		t.Fatalf("highest = %d, want 8: the forwarded token was sent", h)
	}
	// WithoutHolder removes them: the checked method then has none.
	if _, err := cl.UnaryCall(forwarded, request("e"), fencegrpc.WithoutHolder()); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("WithoutHolder on a checked method: %v, want InvalidArgument", err)
	}
	if _, err := cl.EmptyCall(forwarded, &testpb.Empty{}, fencegrpc.WithoutHolder()); err != nil {
		t.Fatalf("WithoutHolder on an unchecked method: %v", err)
	}
}

// StaleFrom reads only the fence's own refusals.
func TestStaleFrom(t *testing.T) {
	stale := fencegrpc.Error(fencestore.Claim{Name: "ledger", Token: 5}, &fence.StaleError{Key: "records/ledger", Token: 5, Highest: 9})
	se, ok := fencegrpc.StaleFrom(stale)
	if !ok || *se != (fence.StaleError{Key: "ledger", Token: 5, Highest: 9}) {
		t.Fatalf("StaleFrom = %+v, %v", se, ok)
	}
	if !strings.Contains(status.Convert(stale).Message(), "stale fencing token 5") {
		t.Errorf("message %q", status.Convert(stale).Message())
	}
	for _, err := range []error{
		nil,
		errors.New("plain"),
		status.Error(codes.Aborted, "a transaction of the service's own"),
		status.Error(codes.InvalidArgument, "bad"),
	} {
		if _, ok := fencegrpc.StaleFrom(err); ok {
			t.Errorf("StaleFrom(%v) read a stale refusal", err)
		}
	}
	for err, want := range map[error]codes.Code{
		fencegrpc.Error(fencestore.Claim{}, fencegrpc.ErrBadMetadata):                        codes.InvalidArgument,
		fencegrpc.Error(fencestore.Claim{}, context.DeadlineExceeded):                        codes.DeadlineExceeded,
		fencegrpc.Error(fencestore.Claim{}, errors.Join(fence.ErrOutcomeUnknown, netErr(t))): codes.Unknown,
		fencegrpc.Error(fencestore.Claim{}, netErr(t)):                                       codes.Unavailable,
	} {
		if status.Code(err) != want {
			t.Errorf("%v: code %v, want %v", err, status.Code(err), want)
		}
	}
}

func netErr(t *testing.T) error { return errors.New(t.Name() + ": connection reset") }

func TestNewCheckerBadInput(t *testing.T) {
	store := fencestore.NewMemoryStore()
	cases := []struct {
		name  string
		store fencestore.Store
		opts  []fencegrpc.Option
	}{
		{"nil store", nil, []fencegrpc.Option{fencegrpc.WithLockName("n")}},
		{"no lock name", store, nil},
		{"nil option", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), nil}},
		{"empty lock name", store, []fencegrpc.Option{fencegrpc.WithLockName("")}},
		{"non-ASCII lock name", store, []fencegrpc.Option{fencegrpc.WithLockName("grüße")}},
		{"lock name twice", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), fencegrpc.WithLockName("m")}},
		{"nil lock name func", store, []fencegrpc.Option{fencegrpc.WithLockNameFunc(nil)}},
		{"short method", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), fencegrpc.WithUncheckedMethods("EmptyCall")}},
		{"method without service", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), fencegrpc.WithUncheckedMethods("/EmptyCall")}},
		{"empty service", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), fencegrpc.WithUncheckedMethods("//EmptyCall")}},
		{"empty method", store, []fencegrpc.Option{fencegrpc.WithLockName("n"), fencegrpc.WithUncheckedMethods("/grpc.testing.TestService/")}},
	}
	for _, tc := range cases {
		if _, err := fencegrpc.NewChecker(tc.store, tc.opts...); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: %v, want fence.ErrInvalidArgument", tc.name, err)
		}
	}
}

// A fencing call option on a connection without the client interceptor
// for its kind fails before sending: sent bare, a claim on an unchecked
// method would pass unrecorded.
func TestCallOptionWithoutInterceptor(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	ck, err := fencegrpc.NewChecker(store, fencegrpc.WithLockName("ledger"), fencegrpc.WithUncheckedMethods(methodEmpty, methodOutput))
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, l, ck, grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor())) // no stream interceptor
	cl := testpb.NewTestServiceClient(conn)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	s, err := cl.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{}, fencegrpc.WithHolder(holder{"ledger", 4}), fencegrpc.WithClaim())
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "no fencegrpc client interceptor") {
		t.Fatalf("stream with a claim and no stream interceptor: %v, want Internal", err)
	}
	if h := store.Highest("ledger"); h != 0 {
		t.Fatalf("highest = %d: the claim reached the server", h)
	}
	// The unary interceptor consumes its options: the call goes out.
	if _, err := cl.EmptyCall(ctx, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 4}), fencegrpc.WithClaim()); err != nil {
		t.Fatal(err)
	}
	if h := store.Highest("ledger"); h != 4 {
		t.Fatalf("highest = %d, want 4", h)
	}
}

// Two fencegrpc interceptors in one chain: the outer one applies the
// call's options, and the inner one's default holder does not override the
// per-call holder.
func TestChainedClientInterceptors(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	ck, err := fencegrpc.NewChecker(store, fencegrpc.WithLockName("ledger"))
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, l, ck, grpc.WithChainUnaryInterceptor(
		fencegrpc.UnaryClientInterceptor(),
		fencegrpc.UnaryClientInterceptor(fencegrpc.WithHolder(holder{"ledger", 3}))))
	cl := testpb.NewTestServiceClient(conn)
	if _, err := cl.UnaryCall(etcdproc.Ctx(t, 30*time.Second), request("x"), fencegrpc.WithHolder(holder{"ledger", 9})); err != nil {
		t.Fatal(err)
	}
	if h := store.Highest("ledger"); h != 9 {
		t.Fatalf("highest = %d, want the per-call holder's 9", h)
	}
}

// Fencing keys sent as binary are refused, on unchecked methods too.
func TestBinaryKeysRefused(t *testing.T) {
	etcdproc.LeakCheck(t)
	l := &ledger{}
	cl := serve(t, l, fencestore.NewMemoryStore(), []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithUncheckedMethods(methodEmpty)})
	for _, k := range []string{"leasefence-claim-bin", "leasefence-lock-bin", "leasefence-token-bin"} {
		ctx := metadata.AppendToOutgoingContext(etcdproc.Ctx(t, 30*time.Second), k, "1")
		if _, err := cl.EmptyCall(ctx, &testpb.Empty{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", k, err)
		}
	}
}

// Error with no claim names the stale error's own lock and token.
func TestErrorWithoutClaim(t *testing.T) {
	err := fencegrpc.Error(fencestore.Claim{}, &fence.StaleError{Key: "ledger", Token: 4, Highest: 6})
	se, ok := fencegrpc.StaleFrom(err)
	if !ok || *se != (fence.StaleError{Key: "ledger", Token: 4, Highest: 6}) {
		t.Fatalf("StaleFrom = %+v, %v", se, ok)
	}
	if c := status.Code(fencegrpc.Error(fencestore.Claim{}, fence.ErrBadRecord)); c != codes.Internal {
		t.Errorf("bad record: %v, want Internal", c)
	}
}
