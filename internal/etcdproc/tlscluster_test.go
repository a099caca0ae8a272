package etcdproc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A member started with TLS serves, over https only, a client that
// presents a certificate of the test's CA, and refuses one that presents
// none.
func TestStartTLS(t *testing.T) {
	etcdproc.LeakCheck(t)
	certs, err := etcdproc.GenerateCerts(t.TempDir(), "ops")
	if err != nil {
		t.Fatal(err)
	}
	c := etcdproc.StartTLST(t, certs)
	if ep := c.Endpoints()[0]; !strings.HasPrefix(ep, "https://") {
		t.Fatalf("endpoint %s, want https", ep)
	}
	call := func(info transport.TLSInfo) error {
		tc, err := info.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: tc, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = cli.Put(ctx, "k", "v")
		return err
	}
	if err := call(certs.Clients["ops"]); err != nil {
		t.Fatalf("with the ops certificate: %v", err)
	}
	if err := call(transport.TLSInfo{TrustedCAFile: certs.CAFile}); err == nil {
		t.Fatal("a client with no certificate was served")
	}
}
