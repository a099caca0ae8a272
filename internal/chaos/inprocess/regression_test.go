package inprocess_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// etcd restored from a snapshot under a live session: without a revision
// bump the store goes backwards and the session's locks end with
// ErrRevisionRegressed; with the bump nothing is reported.
func TestRevisionRegressionAfterRestore(t *testing.T) {
	etcdtest.LeakCheck(t)
	for _, tc := range []struct {
		name string
		bump uint64
	}{{"without bump", 0}, {"with bump", 1_000_000}} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.StartT(t, etcdtest.Config{})
			cli := c.ClientT(t)
			ctx := etcdproc.Ctx(t, 30*time.Second)
			renewed := make(chan struct{}, 64)
			s, err := lease.NewSession(ctx, cli, lease.WithTTL(5*time.Second), lease.WithHooks(&lease.Hooks{
				Renewed: func(time.Duration) {
					select {
					case renewed <- struct{}{}:
					default:
					}
				},
			}))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			l := mustLock(t, s, "jobs")
			snap, err := c.Members[0].Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 50; i++ { // the store moves on past the snapshot
				if _, err := cli.Put(ctx, fmt.Sprintf("data/%d", i), "v"); err != nil {
					t.Fatal(err)
				}
			}
			later := mustLock(t, s, "jobs-later") // the session sees the new revision
			if err := c.Members[0].RestoreFrom(ctx, snap, tc.bump); err != nil {
				t.Fatal(err)
			}
			if tc.bump == 0 {
				select {
				case <-l.Done():
				case <-time.After(15 * time.Second):
					t.Fatal("no regression reported 15s after the restore")
				}
				for _, err := range []error{l.Err(), s.Err()} {
					if !errors.Is(err, lease.ErrRevisionRegressed) || !errors.Is(err, lease.ErrLost) {
						t.Fatalf("ended with %v, want ErrRevisionRegressed (and ErrLost)", err)
					}
				}
				// The lock taken after the snapshot may be found missing
				// first: lost either way.
				<-later.Done()
				if !errors.Is(later.Err(), lease.ErrLost) {
					t.Fatalf("the later lock ended with %v, want ErrLost", later.Err())
				}
				return
			}
			// With the bump: two keep-alive answers from the restored
			// member, and the locks still stand.
			for drained := false; !drained; {
				select {
				case <-renewed:
				default:
					drained = true
				}
			}
			for i := 0; i < 2; i++ {
				select {
				case <-renewed:
				case <-time.After(10 * time.Second):
					t.Fatal("no keep-alive answer after the restore")
				}
			}
			// The lock in the snapshot stands; the one taken after it is
			// not in the restored store, and ends as a deleted key would.
			if l.Err() != nil {
				t.Fatalf("a restore with a bump was reported: %v", l.Err())
			}
			<-later.Done()
			if err := later.Err(); !errors.Is(err, lease.ErrKeyDeleted) {
				t.Fatalf("the lock taken after the snapshot ended with %v, want ErrKeyDeleted", err)
			}
		})
	}
}

// A held lock whose key a restore took away (etcd restored from a
// snapshot without a revision bump, taken before the lock's put) ends
// with its key's end as soon as it reads the key gone, whatever the
// read's revision: a read below the token comes only from such a store.
// Before, a read below the token was dropped, and the lock stayed held
// until the session noticed the regression on a later keep-alive, while
// another session took the name with a lower token.
func TestHeldLockEndsWhenARestoreTookItsKey(t *testing.T) {
	etcdtest.LeakCheck(t)
	c := etcdtest.StartT(t, etcdtest.Config{})
	cli := c.ClientT(t)
	ctx := etcdproc.Ctx(t, 60*time.Second)
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	snap, err := c.Members[0].Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ { // the store moves on past the snapshot
		if _, err := cli.Put(ctx, fmt.Sprintf("data/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	held := mustLock(t, s, "jobs-later")
	if err := c.Members[0].RestoreFrom(ctx, snap, 0); err != nil {
		t.Fatal(err)
	}
	s2, err := lease.NewSession(ctx, cli, lease.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	other, err := s2.Lock(ctx, "jobs-later")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx)
	if held.Err() == nil {
		t.Fatalf("two holders: token %d still held after the restore took its key; the name was taken with token %d", held.Token(), other.Token())
	}
	t.Logf("the first holding (token %d) ended with %v; the name was taken again with token %d", held.Token(), held.Err(), other.Token())
}
