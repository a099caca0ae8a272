package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// TestRunGrantUnanswered: etcd takes the connection but never applies the
// lease grant, as when it has lost quorum: here the one member left of
// three. run gives up within -timeout with exit 69 and a message naming
// the endpoint, rather than hanging.
func TestRunGrantUnanswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a first build of etcd takes minutes
	bin, err := etcdproc.Binary(ctx)
	var c *etcdproc.ProcCluster
	if err == nil {
		c, err = etcdproc.StartProcesses(ctx, bin, t.TempDir(), 3, 100, 1000)
	}
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Whichever member is left, leader or follower, a proposal it takes
	// is never committed: it waits for the server's request timeout
	// (seconds), well past -timeout.
	c.Members[1].Kill()
	c.Members[2].Kill()
	lone := c.Members[0].ClientURL
	start := time.Now()
	p := startLockctl(t, []string{lone}, "-timeout", "500ms", "run", "x", "--", "true")
	if code := p.wait(t, 20*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d, want %d", code, exitUnavailable)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %v with -timeout 500ms", took)
	}
	if !strings.Contains(p.stderr.String(), lone) {
		t.Errorf("stderr %q does not name the endpoint %s", p.stderr.String(), lone)
	}
}
