package etcdtest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// A stopped member of a three-member cluster leaves its peers' raft HTTP
// connections to time out on their own; they are etcd's, not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(serverLeaks(), stoppedMemberLeaks()...)...)
}

func TestSingleMemberReadyFast(t *testing.T) {
	start := time.Now()
	c := StartT(t, Config{})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("single member ready after %v, want under 2s", d)
	}
	cli := c.ClientT(t)
	if _, err := cli.Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
}

// Three members serve writes, and keep serving with one member stopped.
func TestThreeMembers(t *testing.T) {
	c := StartT(t, Config{Members: 3})
	if len(c.Members) != 3 || len(c.Endpoints()) != 3 {
		t.Fatalf("%d members, %d endpoints", len(c.Members), len(c.Endpoints()))
	}
	cli := c.ClientT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r1, err := cli.Put(ctx, "k", "1")
	if err != nil {
		t.Fatal(err)
	}
	c.Members[0].Stop()
	r2, err := cli.Put(ctx, "k", "2")
	if err != nil {
		t.Fatalf("put with one of three members stopped: %v", err)
	}
	if r2.Header.Revision <= r1.Header.Revision {
		t.Errorf("revision %d after %d", r2.Header.Revision, r1.Header.Revision)
	}
	if err := c.Members[0].Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if c.Members[0].Server() == nil {
		t.Fatal("restarted member has no server")
	}
}
