package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

// TestRunGrantUnanswered: etcd takes the connection but never applies the
// lease grant, as when it has lost quorum. run gives up within -timeout
// with exit 69 and a message naming the endpoints, rather than hanging.
func TestRunGrantUnanswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c, err := etcdtest.Start(ctx, etcdtest.Config{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release, err := c.Members[0].HoldApply()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	start := time.Now()
	p := startLockctl(t, c.Endpoints(), "-timeout", "500ms", "run", "x", "--", "true")
	if code := p.wait(t, 20*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d, want %d", code, exitUnavailable)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %v with -timeout 500ms", took)
	}
	if !strings.Contains(p.stderr.String(), c.Endpoints()[0]) {
		t.Errorf("stderr %q does not name the endpoint %s", p.stderr.String(), c.Endpoints()[0])
	}
	release()
}
