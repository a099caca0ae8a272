package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// BenchmarkManyLocksAuth takes n locks of different names on one session,
// one after another, against an etcd process with auth on, as a user whose
// role may write the names' prefix (and the library's own prefixes) but is
// not root. etcd then checks, at each put that attaches a lease, write
// permission on every key already on that lease (ETCD-FACTS, "Auth and
// retries"), so the n-th lock costs in proportion to the locks held
// before it. Reported: the time to take all, and the time per lock of
// the last tenth against the first tenth. This library and
// concurrency.Mutex (one concurrency.Session) side by side; both hold
// every key on one lease. sessions=10: this library with the locks taken
// in turn through 10 sessions of one Keeper, so that each lease holds a
// tenth of them, as the shards example advises under auth. pool=1000:
// this library through a lease.Pool of at most 1,000 locks a session,
// which opens the sessions as it fills them.
func BenchmarkManyLocksAuth(b *testing.B) {
	n := 10000
	if *manyN > 0 {
		n = *manyN
	}
	for _, tc := range []struct {
		impl     string
		sessions int
		pool     int
	}{{"leasefence", 1, 0}, {"mutex", 1, 0}, {"leasefence", 10, 0}, {"leasefence", 0, 1000}} {
		shape := fmt.Sprintf("sessions=%d", tc.sessions)
		if tc.pool > 0 {
			shape = fmt.Sprintf("pool=%d", tc.pool)
		}
		b.Run(fmt.Sprintf("n=%d/impl=%s/%s", n, tc.impl, shape), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				manyLocksAuthOnce(b, n, tc.impl == "leasefence", tc.sessions, tc.pool)
			}
		})
	}
}

// keeperHolder takes locks through k sessions of one Keeper, in turn.
func keeperHolder(b *testing.B, cli *clientv3.Client, k int) holder {
	keeper, err := lease.NewKeeper(cli)
	if err != nil {
		b.Fatal(err)
	}
	sessions := make([]*lease.Session, k)
	for i := range sessions {
		if sessions[i], err = lease.NewSession(context.Background(), cli, lease.WithKeeper(keeper)); err != nil {
			b.Fatal(err)
		}
	}
	next := 0
	return holder{
		lock: func(ctx context.Context, name string) (any, error) {
			s := sessions[next%k]
			next++
			return s.Lock(ctx, name)
		},
		close: keeper.Close, // closes the sessions first
	}
}

// poolHolder takes locks through a lease.Pool of per locks a session.
func poolHolder(b *testing.B, cli *clientv3.Client, per int) holder {
	keeper, err := lease.NewKeeper(cli)
	if err != nil {
		b.Fatal(err)
	}
	p, err := lease.NewPool(keeper, per)
	if err != nil {
		b.Fatal(err)
	}
	return holder{
		lock: func(ctx context.Context, name string) (any, error) { return p.Lock(ctx, name) },
		close: func() error {
			err := p.Close()
			return errors.Join(err, keeper.Close())
		},
	}
}

func manyLocksAuthOnce(b *testing.B, n int, leasefence bool, sessions, pool int) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, err := etcdproc.Start(ctx, etcdproc.Config{NoFsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := etcdproc.Name(b, "auth") + "/"
	root := newClient(b, c.Endpoints()[0], &requests{})
	authOn(b, ctx, root, "app", append([]string{prefix}, lease.OwnPrefixes(prefix)...))
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second,
		Username: "app", Password: "app-pw", Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	var locker holder
	switch {
	case pool > 0:
		locker = poolHolder(b, cli, pool)
	case sessions > 1:
		locker = keeperHolder(b, cli, sessions)
	case leasefence:
		locker = leasefenceHolder(b, cli)
	default:
		locker = mutexHolder(b, cli)
	}
	tenth := max(n/10, 1)
	var first, last time.Duration
	start := time.Now()
	for j := 0; j < n; j++ {
		t0 := time.Now()
		if _, err := locker.lock(ctx, fmt.Sprintf("%s%d", prefix, j)); err != nil {
			b.Fatal(err)
		}
		switch took := time.Since(t0); {
		case j < tenth:
			first += took
		case j >= n-tenth:
			last += took
		}
	}
	b.ReportMetric(time.Since(start).Seconds(), "s-to-take-all")
	b.ReportMetric(float64(first.Microseconds())/float64(tenth), "first-tenth-µs/lock")
	b.ReportMetric(float64(last.Microseconds())/float64(tenth), "last-tenth-µs/lock")
	// Closing revokes the lease: a last check over every key on it.
	if err := locker.close(); err != nil {
		b.Fatal(err)
	}
}

// authOn adds user root (role root) and user role, whose role may read and
// write each of prefixes, then turns auth on.
func authOn(b *testing.B, ctx context.Context, cli *clientv3.Client, role string, prefixes []string) {
	b.Helper()
	must := func(_ any, err error) {
		b.Helper()
		if err != nil {
			b.Fatalf("setting up auth: %v", err)
		}
	}
	for _, r := range []string{"root", role} {
		must(cli.RoleAdd(ctx, r))
		must(cli.UserAdd(ctx, r, r+"-pw"))
		must(cli.UserGrantRole(ctx, r, r))
	}
	for _, p := range prefixes {
		must(cli.RoleGrantPermission(ctx, role, p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)))
	}
	must(cli.AuthEnable(ctx))
}
