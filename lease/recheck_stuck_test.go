package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// One recheck batch that etcd does not answer (held back here, as a read
// sent to a member cut off from the quorum would be) holds up no later
// recheck of the session: here the own-key watch goes down (link cut),
// the key is deleted, the watch comes up again and queues a recheck that
// shows the deletion, while the read of the epoch that is over is still
// stuck. With one batch in flight at a time (before c2d5615) the lock
// ended only a TTL (10 s) later.
func TestStuckRecheckHoldsUpNoOther(t *testing.T) {
	etcdproc.LeakCheck(t)
	link := newCutLink(t)
	name := etcdproc.Name(t, "stuck")
	ctl := newRecheckCtl(name)
	cli := ctl.client(t, []string{link.url})
	other := etcd.Client(t)
	s, err := lease.NewSession(etcdproc.Ctx(t, 10*time.Second), cli, lease.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctl.set(true, 0, true)
	l := mustLock(t, s, name)
	ctl.nextHeld(t, 10*time.Second) // never answered: the batch times out
	link.cut()
	if _, err := other.Delete(etcdproc.Ctx(t, 10*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	ctl.set(true, 0, false)
	link.mend(t)
	t.Cleanup(func() { s.Close(); cli.Close() })
	if _, err := cli.Get(etcdproc.Ctx(t, 10*time.Second), "reconnected"); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	select {
	case <-l.Done():
	case <-time.After(3 * time.Second):
		t.Errorf("lock not ended 3 s after the link came back, its key deleted meanwhile: its recheck waits behind a stuck one")
		<-l.Done()
		t.Logf("ended %v after the link came back (TTL %v)", time.Since(back).Round(time.Millisecond), s.TTL())
	}
	if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("Err = %v", l.Err())
	}
}
