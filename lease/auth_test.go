package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease"
)

// An etcd with auth on, in a member of the test's own (never the shared
// one, nor ETCD_ENDPOINTS): an application whose role may read and write
// only its name prefix P and lease.OwnPrefixes(P), as docs/operations.md
// says, can use every part of a session, renewals and Close included (a
// keep-alive and a revoke need write permission on every key on the
// lease); another application's role can neither read nor write any of
// those keys; a role without the marker prefix is refused at once
// (issue 46).
func TestAuthRolePerPrefix(t *testing.T) {
	etcdproc.LeakCheck(t)
	c := etcdproc.StartT(t, etcdproc.Config{NoFsync: true})
	ctx := etcdproc.Ctx(t, 30*time.Second)
	base := etcdproc.Name(t, "auth")
	p1, p2, p3 := base+"/app1/", base+"/app2/", base+"/nomarker/"
	setUpAuth(t, ctx, c.ClientT(t), map[string][]string{
		"app1":     append([]string{p1}, lease.OwnPrefixes(p1)...),
		"app2":     append([]string{p2}, lease.OwnPrefixes(p2)...),
		"nomarker": {p3, lease.OwnPrefixes(p3)[1]}, // the lock-delay records', not the markers'
	})
	if _, err := c.ClientT(t).Get(ctx, p1); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("a read without credentials: %v, want %v: auth is not on", err, rpctypes.ErrUserEmpty)
	}
	root, cli1, cli2 := authClient(t, c, "root"), authClient(t, c, "app1"), authClient(t, c, "app2")

	t.Run("a session works under the role", func(t *testing.T) {
		authSessionWorks(t, ctx, root, cli1, p1)
	})
	t.Run("another application's role reaches none of the keys", func(t *testing.T) {
		authOthersRefused(t, ctx, root, cli1, cli2, p1, p2)
	})
	t.Run("a role without the marker prefix is refused at once", func(t *testing.T) {
		cli3 := authClient(t, c, "nomarker")
		s := newSession(t, cli3)
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		if l, err := s.Lock(lctx, p3+"job"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("Lock without permission on the marker: lock %v, err %v; want permission denied", l, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the refusal took %v", d)
		}
		expectKeys(t, ctx, root, p3, 0)
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// setUpAuth adds user root with role root, and for each role a user of
// the same name (password: name + "-pw") whose role may read and write
// each of its prefixes, then turns auth on.
func setUpAuth(t *testing.T, ctx context.Context, cli *clientv3.Client, roles map[string][]string) {
	t.Helper()
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("setting up auth: %v", err)
		}
	}
	roles["root"] = nil
	for role, prefixes := range roles {
		must(cli.RoleAdd(ctx, role))
		for _, p := range prefixes {
			must(cli.RoleGrantPermission(ctx, role, p, clientv3.GetPrefixRangeEnd(p), rw))
		}
		must(cli.UserAdd(ctx, role, role+"-pw"))
		must(cli.UserGrantRole(ctx, role, role))
	}
	must(cli.AuthEnable(ctx))
}

// authClient is a client of user, closed when the test ends.
func authClient(t *testing.T, c *etcdproc.Cluster, user string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second,
		Username: user, Password: user + "-pw", Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client of %s: %v", user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// expectKeys fails unless n keys start with prefix, as root reads them.
func expectKeys(t *testing.T, ctx context.Context, root *clientv3.Client, prefix string, n int) {
	t.Helper()
	resp, err := root.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n {
		t.Fatalf("%d keys start with %q, want %d: %v", len(resp.Kvs), prefix, n, resp.Kvs)
	}
}

// expectRenewed waits until etcd has answered keep-alives of s sent for
// over a second after the call: the session's deadline moves on.
func expectRenewed(t *testing.T, s *lease.Session) {
	t.Helper()
	want := s.Deadline().Add(time.Second)
	for end := time.Now().Add(5 * time.Second); s.Deadline().Before(want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) || s.Err() != nil {
			t.Fatalf("the session's lease not renewed: deadline %v, want after %v; session: %v", s.Deadline(), want, s.Err())
		}
	}
}

func expectClose(t *testing.T, s *lease.Session, what string) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close of %s: %v", what, err)
	}
}

// authSessionWorks uses every kind of write a session makes, as app1.
func authSessionWorks(t *testing.T, ctx context.Context, root, cli *clientv3.Client, p string) {
	marker, delay := lease.OwnPrefixes(p)[0], lease.OwnPrefixes(p)[1]

	// The owner record lies outside P: without WithOwner a warning, with it
	// a failure.
	core, logs := observer.New(zap.WarnLevel)
	s := newSession(t, cli, lease.WithLogger(zap.New(core)))
	if n := logs.FilterMessageSnippet("owner not recorded").Len(); n != 1 || s.Owner() != "" {
		t.Errorf("session without the owner record's permission: %d warnings, owner %q", n, s.Owner())
	}
	if o, err := lease.NewSession(ctx, cli, lease.WithOwner("app1")); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("NewSession WithOwner without the owner record's permission: %v, want permission denied", err)
		if err == nil {
			o.Close()
		}
	}

	// Lock, TryLock contended, a waiter granted on Unlock.
	o := newSession(t, cli)
	name := p + "job"
	l := mustLock(t, s, name)
	expectKeys(t, ctx, root, lease.MarkerKey(s, name), 1)
	if _, err := o.TryLock(ctx, name); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("TryLock of a held name: %v, want ErrLocked", err)
	}
	wait := lockAsync(ctx, o, name)
	waitQueued(t, cli, name, 2)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := grantWithin(t, wait, 5*time.Second, "the waiter").Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := o.TryLock(ctx, name); err != nil {
		t.Fatalf("TryLock of a free name: %v", err)
	} else if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Read locks side by side; an election handed over.
	var readers []*lease.Lock
	for _, ss := range []*lease.Session{s, o} {
		r, err := ss.RLock(ctx, p+"shared")
		if err != nil {
			t.Fatalf("RLock: %v", err)
		}
		readers = append(readers, r)
	}
	for _, r := range readers {
		if err := r.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lead, err := s.Campaign(ctx, p+"leader", "s")
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if err := lead.Proclaim(ctx, "s2"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	next := make(chan lockResult, 1)
	go func() {
		e, err := o.Campaign(ctx, p+"leader", "o")
		if err != nil {
			next <- lockResult{nil, err}
			return
		}
		next <- lockResult{e.Lock(), nil}
	}()
	waitQueued(t, cli, p+"leader", 2)
	if err := lead.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if err := grantWithin(t, next, 5*time.Second, "the next candidate").Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// The lock delay: a record at its own place, a loss recorded under a
	// lease of its own and waited out, a record of the old place moved.
	d1 := newSession(t, cli, lease.WithLockDelay(time.Second))
	dcore, dlogs := observer.New(zap.WarnLevel)
	d2 := newSession(t, cli, lease.WithLockDelay(time.Second), lease.WithLogger(zap.New(dcore)))
	dname := p + "delayed"
	mustLock(t, d1, dname)
	expectKeys(t, ctx, root, lease.DelayRecordKey(dname), 1)
	revoked := time.Now()
	if _, err := root.Revoke(ctx, d1.Lease()); err != nil { // d1 loses its lock
		t.Fatal(err)
	}
	if err := mustLock(t, d2, dname).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The loss is recorded by d1 as it sees its key go, or by d2 as its
	// turn comes: either way under a lease, and waited out.
	if waited := time.Since(revoked); waited < time.Second {
		t.Errorf("the loss was not waited out: granted %v after the revoke; %v", waited, dlogs.All())
	}
	oldName := p + "moved"
	if _, err := root.Put(ctx, oldName+"\x00lock-delay", "released 1"); err != nil {
		t.Fatal(err)
	}
	if err := mustLock(t, d2, oldName).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	expectKeys(t, ctx, root, oldName+"\x00", 0)
	expectKeys(t, ctx, root, lease.DelayRecordKey(oldName), 1)

	// An unanswered put, withdrawn: its marker is kept on the lease, and
	// the session's next lock of the name is granted. With the keys on
	// its lease the session renews it (a renewal too needs write
	// permission on every key on the lease).
	u := newSession(t, cli, lease.WithTTL(shortTTL))
	lease.SetKeys(u, &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate { return map[int]fate{0: loseAnswer}[n] }})
	uname := p + "unanswered"
	if l, err := u.Lock(ctx, uname); err == nil {
		t.Fatalf("Lock whose put lost its answer: granted %s", l.Key())
	}
	expectKeys(t, ctx, root, uname+"/", 0)
	ul := mustLock(t, u, uname)
	lease.Withdraw(u, p+"withdrawn")
	expectKeys(t, ctx, root, lease.MarkerKey(u, uname), 1)
	expectKeys(t, ctx, root, lease.MarkerKey(u, p+"withdrawn"), 1)
	expectRenewed(t, u)
	if err := ul.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	for _, ss := range []*lease.Session{s, o, d2, u} {
		expectClose(t, ss, "a session of app1")
	}
	expectKeys(t, ctx, root, marker, 0)
	expectKeys(t, ctx, root, delay, 2) // records stay
}

// authOthersRefused checks that app2 can neither read nor write what a
// session of app1 holds, and that app2's own session (on a Keeper) works
// beside it.
func authOthersRefused(t *testing.T, ctx context.Context, root, cli1, cli2 *clientv3.Client, p1, p2 string) {
	h := newSession(t, cli1, lease.WithLockDelay(time.Second))
	l := mustLock(t, h, p1+"held")
	lease.Withdraw(h, p1+"kept")
	keys := []string{l.Key(), lease.MarkerKey(h, p1+"held"), lease.MarkerKey(h, p1+"kept"), lease.DelayRecordKey(p1 + "held")}
	for _, k := range keys {
		expectKeys(t, ctx, root, k, 1)
	}
	prefixes := append([]string{p1}, lease.OwnPrefixes(p1)...)
	before, err := root.Get(ctx, "\x00")
	if err != nil {
		t.Fatal(err)
	}

	denied := func(what, key string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s %q as app2: %v, want permission denied", what, key, err)
		}
	}
	for _, pfx := range append(prefixes, p1[:len(p1)-len("app1/")]) {
		_, err := cli2.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		denied("read of prefix", pfx, err)
		_, err = cli2.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		denied("count of prefix", pfx, err)
		_, err = cli2.Delete(ctx, pfx, clientv3.WithPrefix())
		denied("delete of prefix", pfx, err)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		wr := <-cli2.Watch(wctx, pfx, clientv3.WithPrefix())
		cancel()
		denied("watch of prefix", pfx, rpcerr.WatchRefusal(wr.Err()))
	}
	k, err := lease.NewKeeper(cli2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	s2 := newSession(t, cli2, lease.WithKeeper(k), lease.WithTTL(shortTTL))
	for _, k := range keys {
		_, err := cli2.Get(ctx, k)
		denied("read of", k, err)
		_, err = cli2.Put(ctx, k, "x")
		denied("put of", k, err)
		_, err = cli2.Put(ctx, k, "x", clientv3.WithLease(s2.Lease()))
		denied("put on app2's lease of", k, err)
		_, err = cli2.Delete(ctx, k)
		denied("delete of", k, err)
		_, err = cli2.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).Commit()
		denied("comparison on", k, err)
	}
	_, err = s2.Lock(ctx, p1+"held")
	denied("Lock of app1's name", p1+"held", err)
	_, err = s2.TryLock(ctx, p1+"held")
	denied("TryLock of app1's name", p1+"held", err)

	after, err := root.Get(ctx, "\x00")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("app2 changed the store: revision %d, then %d", before.Header.Revision, after.Header.Revision)
	}
	if err := l.Err(); err != nil {
		t.Errorf("app1's holding ended: %v", err)
	}

	l2 := mustLock(t, s2, p2+"held")
	if l2.Token() <= l.Token() {
		t.Errorf("app2's token %d not above app1's %d", l2.Token(), l.Token())
	}
	if _, err := cli1.Get(ctx, p2, clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("read of app2's prefix as app1: %v, want permission denied", err)
	}
	expectKeys(t, ctx, root, lease.OwnPrefixes(p2)[0], 1)
	expectRenewed(t, s2)
	expectClose(t, s2, "app2's session")
	expectClose(t, h, "app1's session")
	for _, pfx := range append(prefixes, p2) {
		if pfx != lease.OwnPrefixes(p1)[1] {
			expectKeys(t, ctx, root, pfx, 0)
		}
	}
}
