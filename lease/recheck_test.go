package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A lock granted at once opens the watch of its key 50 ms later and then
// reads the key, which catches a deletion made before the watch was up.
// If that read fails, the watch starts over and reads again as it comes
// up: the deletion still ends the lock.
func TestFailedRecheckReadsAgain(t *testing.T) {
	cli := etcd.Client(t)
	s := newSession(t, cli)
	failed := lease.FailRechecks(s, 1)
	name := etcdproc.Name(t, "recheck")
	l := mustLock(t, s, name)
	// Within the 50 ms before the watch opens: only the read sees it.
	if _, err := cli.Delete(etcdproc.Ctx(t, 10*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the lock did not end in 10 s after its key was deleted (%d reads failed)", failed())
	}
	if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("Err = %v, want ErrKeyDeleted", l.Err())
	}
	if failed() != 1 {
		t.Fatalf("%d reads of the key failed, want 1: the test did not take the path it is for", failed())
	}
}
