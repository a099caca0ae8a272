package fencegrpc_test

import (
	"errors"
	"fmt"
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

// The gap a claim closes, in four steps: A (token 3) writes; B (token 6)
// takes over and reads; A's late write arrives; B writes. With a plain
// read, A's late write lands after B's read, and B builds on a state that
// changed under it. With a claim before the read, A's late write is
// refused.
func TestClaimClosesReadGap(t *testing.T) {
	for kind, mk := range stores() {
		for _, claim := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/claim=%v", kind, claim), func(t *testing.T) {
				etcdproc.LeakCheck(t)
				sk := mk(t)
				l := &ledger{write: sk.write}
				cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler(), fencegrpc.WithUncheckedMethods(methodEmpty)})
				ctx := etcdproc.Ctx(t, 30*time.Second)
				a, b := holder{"ledger", 3}, holder{"ledger", 6}
				if _, err := cl.UnaryCall(ctx, request("a1"), fencegrpc.WithHolder(a)); err != nil {
					t.Fatal(err)
				}
				if _, err := cl.EmptyCall(ctx, &testpb.Empty{}, fencegrpc.WithHolder(b), claimOpt(claim)); err != nil {
					t.Fatal(err)
				}
				_, lateErr := cl.UnaryCall(ctx, request("a2"), fencegrpc.WithHolder(a))
				if _, err := cl.UnaryCall(ctx, request("b1"), fencegrpc.WithHolder(b)); err != nil {
					t.Fatal(err)
				}
				got := fmt.Sprint(sk.applied(l))
				if claim {
					wantStale(t, lateErr, "ledger", 3, 6)
					if got != "[3 6]" {
						t.Fatalf("writes %s, want [3 6]", got)
					}
					return
				}
				if lateErr != nil || got != "[3 3 6]" {
					t.Fatalf("without a claim: late write %v, writes %s; want it accepted, [3 3 6]", lateErr, got)
				}
			})
		}
	}
}

// claimOpt is WithClaim, or an option that changes nothing.
func claimOpt(claim bool) fencegrpc.CallOption {
	if claim {
		return fencegrpc.WithClaim()
	}
	return fencegrpc.CallOption{}
}

// A claim marker the caller put in the outgoing metadata itself, as
// fencehttp's Transport honours a Leasefence-Claim header set on the
// request, reaches the server with the holder's keys: the call is a claim
// and its token is recorded, or, malformed, it is refused. Dropping it
// would turn the claim into a plain read that the caller believes
// protected.
func TestClaimKeyInOutgoingMetadata(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	// StreamingOutputCall: unchecked too, so only a claim records.
	unchecked := fencegrpc.WithUncheckedMethods(methodEmpty, "/grpc.testing.TestService/StreamingOutputCall")
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), unchecked}, fencegrpc.WithHolder(holder{"ledger", 4}))
	ctx := etcdproc.Ctx(t, 30*time.Second)
	claimCtx := metadata.AppendToOutgoingContext(ctx, fencegrpc.MetadataClaim, "1")
	if _, err := cl.EmptyCall(claimCtx, &testpb.Empty{}); err != nil {
		t.Fatalf("claim by metadata: %v", err)
	}
	if h := store.Highest("ledger"); h != 4 {
		t.Fatalf("highest = %d after a claim by metadata, want 4: the claim was dropped", h)
	}
	if _, err := cl.EmptyCall(claimCtx, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 3})); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale claim by metadata: %v, want a stale refusal", err)
	}
	// With WithClaim too, the marker is sent once.
	if _, err := cl.EmptyCall(claimCtx, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 5}), fencegrpc.WithClaim()); err != nil {
		t.Fatalf("claim by metadata and WithClaim: %v", err)
	}
	if h := store.Highest("ledger"); h != 5 {
		t.Fatalf("highest = %d, want 5", h)
	}
	// On a stream as on a unary call.
	s, err := cl.StreamingOutputCall(metadata.AppendToOutgoingContext(ctx, fencegrpc.MetadataClaim, "1"), &testpb.StreamingOutputCallRequest{}, fencegrpc.WithHolder(holder{"ledger", 6}))
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("stream claim by metadata: %v, want the handler's Unimplemented", err)
	}
	if h := store.Highest("ledger"); h != 6 {
		t.Fatalf("highest = %d after a stream claim by metadata, want 6", h)
	}
	// A malformed marker is refused, not read as no claim.
	bad := metadata.AppendToOutgoingContext(ctx, fencegrpc.MetadataClaim, "true")
	if _, err := cl.EmptyCall(bad, &testpb.Empty{}, fencegrpc.WithHolder(holder{"ledger", 7})); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed marker: %v, want InvalidArgument", err)
	}
	if _, calls := l.snapshot(); calls != 2 {
		t.Fatalf("%d handler runs, want 2", calls)
	}
}
