package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// unreachable checks the error of a call whose ctx ended while etcd never
// answered: it matches ctx's error, says so, and names the endpoint, with
// no logger or hooks to have said it before.
func unreachable(t *testing.T, err error, want error, addr string) {
	t.Helper()
	switch {
	case !errors.Is(err, want):
		t.Fatalf("error %v does not match %v", err, want)
	case !strings.Contains(err.Error(), "etcd at "+addr+" did not answer within"):
		t.Errorf("error does not say that etcd at %s did not answer: %v", addr, err)
	}
}

func TestUnreachableNewSession(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, addr := etcdproc.Unanswered(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s, err := lease.NewSession(ctx, cli)
	if err == nil {
		s.Close()
		t.Fatal("NewSession succeeded with no etcd")
	}
	unreachable(t, err, context.DeadlineExceeded, addr)
}

func TestUnreachableRun(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, addr := etcdproc.Unanswered(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel) // the service shutting down
	err := lease.Run(ctx, cli, "unreachable", func(context.Context, *lease.Lock) error {
		t.Error("fn called with no etcd")
		return nil
	})
	unreachable(t, err, context.Canceled, addr)
}
