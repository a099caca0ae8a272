package watch

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/leasefence/leasefence/internal/rpcerr"
)

// etcd gives a refused create's gRPC error as its text (CancelReason):
// a refusal is told as one, an expired token as that (which a new stream
// cures), and any other reason as neither.
func TestCancelReasons(t *testing.T) {
	for _, tc := range []struct {
		reason  string
		refusal error
		expired bool
	}{
		{rpctypes.ErrGRPCPermissionDenied.Error(), rpctypes.ErrPermissionDenied, false},
		{rpctypes.ErrGRPCInvalidAuthToken.Error(), rpctypes.ErrInvalidAuthToken, true},
		{"etcdserver: mvcc: required revision is a future revision", nil, false},
	} {
		resp := &pb.WatchResponse{Created: true, Canceled: true, CancelReason: tc.reason}
		if got := rpcerr.WatchRefusal(cancelErr(resp)); got != tc.refusal {
			t.Errorf("%q: refusal %v, want %v", tc.reason, got, tc.refusal)
		}
		if got := tokenExpired(resp); got != tc.expired {
			t.Errorf("%q: token expired %v, want %v", tc.reason, got, tc.expired)
		}
	}
}
