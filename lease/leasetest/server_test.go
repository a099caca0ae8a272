package leasetest_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasefence/leasefence/lease/leasetest"
)

// Every test of this package ends with no goroutine left, etcd's included.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServerReadyAndClean(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	start := time.Now()
	var ready time.Duration
	t.Run("server", func(t *testing.T) {
		srv := leasetest.NewServer(t)
		ready = time.Since(start)
		cli := srv.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
		if resp, err := cli.Get(ctx, "k"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			t.Fatalf("Get: %v %v", resp, err)
		}
	})
	if ready > 3*time.Second {
		t.Errorf("NewServer took %v, want under 3s", ready)
	}
	t.Logf("server ready in %v", ready)
}

func TestStopRestart(t *testing.T) {
	srv := leasetest.NewServer(t)
	cli := srv.Client(t)
	srv.Stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cli.Put(ctx, "k", "v")
	cancel()
	if err == nil {
		t.Fatal("a put reached a stopped server")
	}
	srv.Restart(t)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}
