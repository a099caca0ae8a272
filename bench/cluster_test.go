package bench

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// BenchmarkCluster runs the handoff (4 contenders on one shared client) and
// a guarded put against a 3-member embedded cluster (fsync off), with the
// client on the leader and on a follower, for this library and
// concurrency.Mutex side by side. On a follower every write is forwarded
// to the leader, and a linearizable read costs a round of heartbeats.
func BenchmarkCluster(b *testing.B) {
	for _, member := range []string{"leader", "follower"} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("member=%s/op=handoff/impl=%s", member, im.name), func(b *testing.B) {
				handoffBench(b, im, "shared", 4, clusterEndpoint(b, member))
			})
		}
		b.Run(fmt.Sprintf("member=%s/op=put/impl=plain", member), func(b *testing.B) {
			cli := newClient(b, clusterEndpoint(b, member), &requests{})
			key := etcdproc.Name(b, "cluster-put")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := cli.Put(context.Background(), key, "v"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("member=%s/op=put/impl=recorder", member), func(b *testing.B) {
			cli := newClient(b, clusterEndpoint(b, member), &requests{})
			ctx := context.Background()
			name := etcdproc.Name(b, "cluster-put")
			l := heldLock(b, cli, name)
			r := fence.NewRecorder(name + "-fence")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := fence.NewTxn(ctx, cli, fence.Held(l), r.Guard(l.Token())).Then(clientv3.OpPut(name+"-data", "v")).Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// clusterEndpoint is the client URL of the 3-member cluster's leader, or of
// one of its followers.
func clusterEndpoint(b *testing.B, member string) string {
	c := cluster(b, 3, true)
	leader := c.Leader()
	if leader == nil {
		b.Fatal("no leader")
	}
	for _, m := range c.Members {
		if (m == leader) == (member == "leader") {
			return m.ClientURL
		}
	}
	b.Fatalf("no %s", member)
	return ""
}
