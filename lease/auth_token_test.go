package lease_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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

// A held lock whose role keeps write but loses read permission on the
// name (its keep-alives still pass): its own-key watch, up before, sees
// its key's deletion. When the stream starts over for an expired token (a
// lock of another name taken after the stream sat idle), that watch is
// created again and refused: the lock, blind to its key, must end rather
// than stay held while its key is deleted and the name taken by others.
func TestHeldLockOwnWatchRefusedOnRestart(t *testing.T) {
	etcdproc.LeakCheck(t)
	c := etcdproc.StartT(t, etcdproc.Config{NoFsync: true, Args: []string{"--auth-token=simple", "--auth-token-ttl=1"}})
	ctx := etcdproc.Ctx(t, time.Minute)
	base := etcdproc.Name(t, "revoke")
	p, q := base+"/p/", base+"/q/"
	setUpAuth(t, ctx, c.ClientT(t), map[string][]string{"app": append([]string{p, q}, append(lease.OwnPrefixes(p), lease.OwnPrefixes(q)...)...)})
	root, cli := authClient(t, c, "root"), authClient(t, c, "app")
	s := newSession(t, cli, lease.WithTTL(5*time.Second))
	// Its own-key watch opens 50 ms after the grant; whether it is up
	// before the permission changes or is refused at its first create,
	// the lock must end.
	l := mustLock(t, s, p+"a")
	if _, err := root.RoleRevokePermission(ctx, "app", p, clientv3.GetPrefixRangeEnd(p)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, "app", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermWrite)); err != nil {
		t.Fatal(err)
	}
	// Waiting out the token's TTL is the condition itself.
	time.Sleep(3 * time.Second)
	mustLock(t, s, q+"b") // its create meets the expired token: the stream starts over
	if _, err := root.Delete(ctx, l.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if !errors.Is(l.Err(), lease.ErrLost) {
			t.Errorf("the lock ended %v, want ErrLost", l.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a held lock whose own-key watch is refused: its key's deletion not seen in 10 s (session: %v)", s.Err())
	}
}
