package etcdtest

import (
	"context"
	"net"
	"testing"

	"github.com/leasefence/leasefence/internal/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Kept only for lease/leasetest and examples/lockctl, which are being made
// self-contained: delete each with its last user. Everything else calls
// package etcdproc's.

// Name is etcdproc.Name.
func Name(tb testing.TB, base string) string { return etcdproc.Name(tb, base) }

// NewClientVia is etcdproc.NewClientVia.
func NewClientVia(endpoints []string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*clientv3.Client, error) {
	return etcdproc.NewClientVia(endpoints, dial)
}
