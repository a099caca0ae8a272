package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// TestTLSAndAuth runs the core of the suite against an etcd that speaks
// only TLS, requires client certificates, and has authentication on: only
// who belongs gets in, and nobody else can move a fence or write a byte.
func TestTLSAndAuth(t *testing.T) {
	certs, err := etcdproc.GenerateCerts(t.TempDir(), "root", "locker", "nofence", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	c := etcdtest.StartT(t, etcdtest.Config{ClientTLS: &certs.Server, TickMs: 50, ElectionMs: 500})
	connect := func(cert, user, password string) (*clientv3.Client, error) {
		info := certs.Clients[cert]
		tc, err := info.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: tc, Username: user, Password: password,
			DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			t.Cleanup(func() { cli.Close() })
		}
		return cli, err
	}
	ctx := etcdproc.Ctx(t, time.Minute)

	// Roles: locker may write locks, fences and data; nofence may take
	// locks and write data but only read fence records; nobody has no role.
	admin, err := connect("root", "", "")
	if err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { _, err := admin.RoleAdd(ctx, "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
	}
	rw, ro := clientv3.PermissionType(clientv3.PermReadWrite), clientv3.PermissionType(clientv3.PermRead)
	perms := map[string]map[string]clientv3.PermissionType{
		"locker":  {"locks/": rw, "fences/": rw, "data/": rw},
		"nofence": {"locks/": rw, "fences/": ro, "data/": rw},
	}
	// The library's own keys for names under locks/ (docs/operations.md).
	for _, ps := range perms {
		for _, own := range lease.OwnPrefixes("locks/") {
			ps[own] = rw
		}
	}
	for role, ps := range perms {
		steps = append(steps, func() error { _, err := admin.RoleAdd(ctx, role); return err })
		for pfx, perm := range ps {
			steps = append(steps, func() error {
				_, err := admin.RoleGrantPermission(ctx, role, pfx, clientv3.GetPrefixRangeEnd(pfx), perm)
				return err
			})
		}
		steps = append(steps,
			func() error { _, err := admin.UserAdd(ctx, role, role+"-pw"); return err },
			func() error { _, err := admin.UserGrantRole(ctx, role, role); return err })
	}
	steps = append(steps,
		func() error { _, err := admin.UserAdd(ctx, "nobody", "nobody-pw"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err })
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("setting up auth: %v", err)
		}
	}
	root, err := connect("root", "root", "root-pw")
	if err != nil {
		t.Fatal(err)
	}
	// Fence records live under fences/, apart from the data.
	fenced := func(cli *clientv3.Client, token int64, val string) error {
		_, err := fence.NewTxn(ctx, cli, fence.Resource("fences/job", token)).Then(clientv3.OpPut("data/job", val)).Commit()
		return err
	}
	revision := func() int64 {
		r, err := root.Get(ctx, "data/probe")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}

	t.Run("members get in and the fence works", func(t *testing.T) {
		a, err := connect("locker", "locker", "locker-pw")
		if err != nil {
			t.Fatal(err)
		}
		sa := session(t, ctx, a, ttl)
		la := lock(t, ctx, sa, "locks/job")
		if err := fenced(a, la.Token(), "a"); err != nil {
			t.Fatalf("holder's fenced write: %v", err)
		}
		if _, err := fence.NewTxn(ctx, a, fence.Held(la)).Then(clientv3.OpPut("data/job-held", "a")).Commit(); err != nil {
			t.Fatalf("holder's Held write: %v", err)
		}
		if _, err := root.Revoke(ctx, sa.Lease()); err != nil { // A's lease ends under it
			t.Fatal(err)
		}
		b, err := connect("locker", "locker", "locker-pw")
		if err != nil {
			t.Fatal(err)
		}
		lb := lock(t, ctx, session(t, ctx, b, ttl), "locks/job")
		defer lb.Unlock(ctx)
		if lb.Token() <= la.Token() {
			t.Errorf("token %d not above %d", lb.Token(), la.Token())
		}
		if err := fenced(b, lb.Token(), "b"); err != nil {
			t.Fatal(err)
		}
		if err := fenced(a, la.Token(), "stale"); !errors.Is(err, fence.ErrStale) {
			t.Errorf("stale write under TLS and auth: %v, want ErrStale", err)
		}
	})

	t.Run("a user without the role is refused at once and writes nothing", func(t *testing.T) {
		cli, err := connect("nobody", "nobody", "nobody-pw")
		if err != nil {
			t.Fatal(err)
		}
		before := revision()
		start := time.Now()
		err = func() error {
			s, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
			if err != nil {
				return err
			}
			defer s.Close()
			_, err = s.Lock(ctx, "locks/job")
			return err
		}()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("Lock without permission: %v, want permission denied", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("refusal took %v", d)
		}
		if after := revision(); after != before {
			t.Errorf("store moved from revision %d to %d", before, after)
		}
	})

	t.Run("lease.Run ends at once on a refusal, without calling fn", func(t *testing.T) {
		cli, err := connect("nobody", "nobody", "nobody-pw")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		called := false
		err = lease.Run(ctx, cli, "locks/job", func(context.Context, *lease.Lock) error {
			called = true
			return nil
		}, lease.WithTTL(ttl))
		if !errors.Is(err, rpctypes.ErrPermissionDenied) || called {
			t.Errorf("Run without permission: %v (fn called: %v), want permission denied", err, called)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("refusal took %v", d)
		}
	})

	t.Run("a user who may lock but not write fence records cannot move a fence", func(t *testing.T) {
		cli, err := connect("nofence", "nofence", "nofence-pw")
		if err != nil {
			t.Fatal(err)
		}
		l := lock(t, ctx, session(t, ctx, cli, ttl), "locks/job2")
		defer l.Unlock(ctx)
		before := revision()
		start := time.Now()
		err = fenced(cli, l.Token(), "nofence")
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("fenced write without write access to the record: %v, want permission denied", err)
		}
		if errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("a permission error reported as an unknown outcome: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("refusal took %v", d)
		}
		if after := revision(); after != before {
			t.Errorf("store moved from revision %d to %d", before, after)
		}
		if got := value(t, root, "data/job"); got != "b" {
			t.Errorf("data is %q", got)
		}
	})

	t.Run("a wrong password is refused", func(t *testing.T) {
		if _, err := connect("locker", "locker", "wrong"); !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Errorf("wrong password: %v, want authentication failed", err)
		}
	})

	// A handshake that fails for a certificate reason fails NewSession at
	// once, with the reason, instead of when its ctx ends.
	other, err := etcdproc.GenerateCerts(t.TempDir(), "stranger")
	if err != nil {
		t.Fatal(err)
	}
	trusted := x509.NewCertPool()
	if pem, err := os.ReadFile(certs.CAFile); err != nil || !trusted.AppendCertsFromPEM(pem) {
		t.Fatal("reading the CA")
	}
	lockerTLS, err := certs.Clients["locker"].ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	strangerTLS, err := other.Clients["stranger"].ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	strangerTLS.RootCAs = trusted
	untrusting := lockerTLS.Clone()
	untrusting.RootCAs = x509.NewCertPool()
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"a client without a certificate", &tls.Config{RootCAs: trusted}},
		{"a client with a certificate of another CA", strangerTLS},
		{"a client that does not trust etcd's certificate", untrusting},
	} {
		t.Run(tc.name+" is refused at once", func(t *testing.T) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: tc.tls, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			start := time.Now()
			s, err := lease.NewSession(sctx, cli)
			took := time.Since(start)
			if err == nil {
				s.Close()
				t.Fatal("got a session")
			}
			t.Logf("refused after %v: %v", took.Round(time.Millisecond), err)
			if !errors.Is(err, lease.ErrTLSHandshake) {
				t.Errorf("err = %v, want ErrTLSHandshake", err)
			}
			if took >= time.Second {
				t.Errorf("refused after %v, want under 1s", took)
			}
			// Run gives up too: retrying a certificate failure cannot help.
			start = time.Now()
			err = lease.Run(sctx, cli, "tls-run", func(context.Context, *lease.Lock) error { return nil })
			if !errors.Is(err, lease.ErrTLSHandshake) || time.Since(start) >= time.Second {
				t.Errorf("Run = %v after %v, want ErrTLSHandshake under 1s", err, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}
