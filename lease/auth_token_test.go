package lease_test

import (
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// etcd's simple auth tokens expire after --auth-token-ttl without use, and
// a watch stream carries the token it opened with. A session whose stream
// was idle past that still watches the key of a lock it takes later: the
// lock's own-key watch comes up (its key's deletion ends it), rather than
// being refused for good with the stream's expired token.
func TestLockAfterStreamTokenExpired(t *testing.T) {
	etcdproc.LeakCheck(t)
	c := etcdproc.StartT(t, etcdproc.Config{NoFsync: true, Args: []string{"--auth-token=simple", "--auth-token-ttl=1"}})
	ctx := etcdproc.Ctx(t, time.Minute)
	p := etcdproc.Name(t, "token") + "/"
	setUpAuth(t, ctx, c.ClientT(t), map[string][]string{"app": append([]string{p}, lease.OwnPrefixes(p)...)})
	root, cli := authClient(t, c, "root"), authClient(t, c, "app")
	s := newSession(t, cli, lease.WithTTL(5*time.Second))
	for i, idle := range []time.Duration{0, 3 * time.Second} {
		// Waiting out the token's TTL is the condition itself: no event
		// tells of it.
		time.Sleep(idle)
		// Deleted at once: the own-key watch opens 50 ms after the grant,
		// and the read it makes as it comes up finds the key gone.
		l := mustLock(t, s, p+string(rune('a'+i)))
		if _, err := root.Delete(ctx, l.Key()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
			t.Logf("lock %d (after %v idle): ended %v", i, idle, l.Err())
		case <-time.After(5 * time.Second):
			t.Fatalf("lock %d, taken after the stream was idle %v: its key's deletion not seen in 5 s (session: %v)", i, idle, s.Err())
		}
	}
}
