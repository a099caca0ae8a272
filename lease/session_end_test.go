package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A session's locks have ended by the time the session is seen ended: once
// its Done is closed (or its Err set), each lock's Err is set, and an
// Unlock called then sends nothing and says the session closed, rather
// than racing Close's revoke into a loss. Found by a cold review: the
// session's end reached its locks only from a goroutine it started, and
// until then Err was nil and Unlock sent its delete, to be told ErrLost
// once the lease was revoked.
func TestLocksEndedWithSession(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	const rounds = 40
	for r := range rounds {
		s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli)
		if err != nil {
			t.Fatal(err)
		}
		ls := []*lease.Lock{
			mustLock(t, s, etcdproc.Name(t, "ended-a")),
			mustLock(t, s, etcdproc.Name(t, "ended-b")),
		}
		type seen struct {
			errNil  int
			unlock  error
			lockErr error
		}
		got := make(chan seen, 1)
		go func() {
			<-s.Done()
			var v seen
			for _, l := range ls {
				if l.Err() == nil {
					v.errNil++
				}
			}
			v.unlock = ls[0].Unlock(context.Background())
			v.lockErr = ls[0].Err()
			got <- v
		}()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		v := <-got
		if v.errNil != 0 {
			t.Fatalf("round %d: %d locks had no Err once the session's Done was closed", r, v.errNil)
		}
		if !errors.Is(v.unlock, lease.ErrSessionClosed) || errors.Is(v.unlock, lease.ErrLost) {
			t.Fatalf("round %d: Unlock after the session's Done returned %v, want ErrSessionClosed", r, v.unlock)
		}
		if !errors.Is(v.lockErr, lease.ErrSessionClosed) {
			t.Fatalf("round %d: the lock's Err is %v, want ErrSessionClosed", r, v.lockErr)
		}
		for _, l := range ls {
			<-l.Done()
		}
	}
}
