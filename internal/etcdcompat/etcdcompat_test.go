package etcdcompat_test

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdcompat"
)

// Whatever the client's version, the comparison comes back whole: the
// target, the result, the key and the revision compared with.
func TestCompare(t *testing.T) {
	pc := etcdcompat.Compare(clientv3.Compare(clientv3.CreateRevision("k"), ">", 42))
	if pc == nil {
		t.Fatal("no comparison")
	}
	if pc.GetTarget() != pb.Compare_CREATE || pc.GetResult() != pb.Compare_GREATER ||
		string(pc.GetKey()) != "k" || pc.GetCreateRevision() != 42 {
		t.Fatalf("got %v", pc)
	}
	pv := etcdcompat.Compare(clientv3.Compare(clientv3.Value("k"), "=", "v"))
	if pv.GetTarget() != pb.Compare_VALUE || string(pv.GetValue()) != "v" {
		t.Fatalf("got %v", pv)
	}
}
