package lease_test

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A waiter with a shorter delay than the holder's waits out the holder's:
// the delay a holding asks travels with its record.
func TestLockDelayHoldersDelayWins(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-mixed")
	const long = 4 * time.Second
	holder := newSession(t, cli, lease.WithTTL(shortTTL), lease.WithLockDelay(long))
	type delaying struct {
		lost int64
		left time.Duration
	}
	told := make(chan delaying, 4)
	waiter := newSession(t, cli, lease.WithTTL(shortTTL), lease.WithLockDelay(time.Second),
		lease.WithHooks(&lease.Hooks{Delaying: func(_ string, lost int64, left time.Duration) { told <- delaying{lost, left} }}))
	h := mustLock(t, holder, name)
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
	waitQueued(t, cli, name, 2)
	waitRecord(t, cli, name, "held ")
	rec, err := lease.InspectDelay(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if want := (lease.DelayRecord{State: "held", Token: h.Token(), Delay: long}); err != nil || rec != want {
		t.Fatalf("InspectDelay while held: %+v %v, want %+v", rec, err, want)
	}
	revoked := time.Now()
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), holder.Lease()); err != nil {
		t.Fatal(err)
	}
	d := <-told
	if d.lost != h.Token() || d.left <= 0 || d.left > long+time.Second {
		t.Errorf("Hooks.Delaying: lost %d with %v left, want %d with at most %v", d.lost, d.left, h.Token(), long+time.Second)
	}
	rec, err = lease.InspectDelay(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil || rec.State != "lost" || rec.Token != h.Token() || rec.Delay != long || rec.Left <= 0 {
		t.Errorf("InspectDelay during the delay: %+v %v, want lost %d, delay %v, time left", rec, err, h.Token(), long)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	waited := time.Since(revoked)
	t.Logf("granted %v after the revoke", waited.Round(time.Millisecond))
	if waited < long || waited > long+2*time.Second {
		t.Errorf("granted %v after the holder's loss, want its delay %v (not the waiter's 1s), and not far past it", waited, long)
	}
	mustUnlock(t, r.l)
	if len(told) != 0 {
		t.Errorf("Hooks.Delaying called again: %+v", <-told)
	}
}

// A record whose holder's session ended longer ago than the delay it
// asked delays nothing: it lapses with the session's delay lease, and a
// later waiter, with a longer delay of its own, is granted at once.
func TestLockDelayStaleRecordLapses(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-stale")
	holder := newSession(t, cli, lease.WithTTL(shortTTL), lease.WithLockDelay(time.Second))
	mustLock(t, holder, name)
	waitRecord(t, cli, name, "held ")
	// The holder's session ends with no waiter to see it: its lease is
	// revoked, so it renews nothing more, the delay lease included.
	gone := watchGone(t, cli, lease.DelayRecordKey(name))
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), holder.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(shortTTL + time.Second + 2*time.Second + 2*time.Second):
		t.Fatal("the record of a holding whose session ended never lapsed")
	}
	late := newSession(t, cli, lease.WithLockDelay(10*time.Second))
	start := time.Now()
	l := mustLock(t, late, name)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("granted %v after a stale record: delayed for nothing", waited)
	}
	mustUnlock(t, l)
}

// A holder whose key is deleted while its session lives records its own
// loss under a lease of its delay, so the record does not outlive the
// delay while the session goes on; a waiter arriving after that is not
// delayed.
func TestLockDelayHolderRecordsOwnLoss(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-own-loss")
	holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
	l := mustLock(t, holder, name)
	waitRecord(t, cli, name, "held ")
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	waitRecord(t, cli, name, fmt.Sprintf("lost %d %v", l.Token(), lockDelay))
	g := keyGet(t, cli, lease.DelayRecordKey(name))
	ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), clientv3.LeaseID(g.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != int64(lockDelay/time.Second) {
		t.Fatalf("the lost record's lease: %+v %v, want a lease of the delay %v", ttl, err, lockDelay)
	}
	gone := watchGone(t, cli, lease.DelayRecordKey(name))
	select {
	case <-gone:
	case <-time.After(lockDelay + 2*time.Second):
		t.Fatal("the holder's own loss record never lapsed")
	}
	if holder.Err() != nil {
		t.Fatalf("the session ended: %v", holder.Err())
	}
	start := time.Now()
	l2 := mustLock(t, newSession(t, cli, lease.WithLockDelay(lockDelay)), name)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("granted %v after the loss was waited out: delayed again", waited)
	}
	mustUnlock(t, l2)
}

// Close, with every holding released, revokes the session's delay lease;
// a session without a lock delay never grants one.
func TestCloseRevokesDelayLease(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-close")
	s := newSession(t, cli, lease.WithLockDelay(lockDelay))
	mustLock(t, s, name)
	id := lease.DelayLease(s)
	if id == 0 {
		t.Fatal("a session that recorded a holding has no delay lease")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), id)
	if err != nil || ttl.TTL != -1 {
		t.Errorf("the delay lease after Close: %+v %v, want gone", ttl, err)
	}
	plain := newSession(t, cli)
	mustUnlock(t, mustLock(t, plain, name))
	if lease.DelayLease(plain) != 0 {
		t.Error("a session without a lock delay granted a delay lease")
	}
}

// A session closed right after one of its holdings lost its key keeps
// the loss on record: Close does not take the delay lease down while a
// record is on it, and the holder's own loss record is written even as
// the session closes. (A cold review found Close deleting it.)
func TestCloseAfterLossKeepsDelay(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-close-after-loss")
	holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
	l := mustLock(t, holder, name)
	waitRecord(t, cli, name, "held ")
	lost := time.Now()
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	holder.Close()
	l2 := mustLock(t, newSession(t, cli, lease.WithLockDelay(lockDelay)), name)
	if waited := time.Since(lost); waited < lockDelay {
		t.Errorf("granted %v after an involuntary loss and its session's Close, want at least %v", waited, lockDelay)
	}
	mustUnlock(t, l2)
}

// A "lost" record of an older version, which says no delay, is waited out
// for the waiter's own delay, counted from when it found it.
func TestOldLostRecordCountsOwnDelay(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-old-lost")
	ctx := etcdproc.Ctx(t, 30*time.Second)
	g, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, lease.DelayRecordKey(name), "lost 1", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	const own = 4 * time.Second
	start := time.Now()
	l := mustLock(t, newSession(t, cli, lease.WithLockDelay(own)), name)
	if waited := time.Since(start); waited < own {
		t.Errorf("granted %v after an old lost record on a 2 s lease, want the waiter's own %v", waited, own)
	}
	mustUnlock(t, l)
}
