// Package objectfence_test runs package objectfence against real S3
// servers: versitygw, which honours conditional puts, and s3rver, which
// ignores them (internal/s3test). It is a module of its own so that the
// servers' harness stays out of the graph of objectfence's users.
package objectfence_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/s3test"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }

func testCtx(t testing.TB) context.Context { return etcdproc.Ctx(t, 60*time.Second) }

// lockName is the lock whose tokens fence the tests' manifests.
const lockName = "tables/orders"

// newFence is a Fence on a fresh bucket of a real versitygw, with its store.
func newFence(t *testing.T, opts ...objectfence.Option) (*objectfence.Fence, objectfence.Store, *s3test.Server) {
	t.Helper()
	srv, bucket := s3test.StartVersityT(t)
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	f, err := objectfence.New(store, "tables/orders/manifest", lockName, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return f, store, srv
}
