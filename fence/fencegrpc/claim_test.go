package fencegrpc_test

import (
	"fmt"
	"testing"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/internal/etcdtest"
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
				etcdtest.LeakCheck(t)
				sk := mk(t)
				l := &ledger{write: sk.write}
				cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler(), fencegrpc.WithUncheckedMethods(methodEmpty)})
				ctx := testCtx(t)
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
