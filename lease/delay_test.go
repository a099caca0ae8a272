package lease_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

// lockDelay is the delay the tests ask for: etcd's shortest lease with
// default timing, which is what measures it.
const lockDelay = 2 * time.Second

// delayChildRole is the role of a child process (exampleenv.StartChild)
// that takes a lock with a lock delay, prints "LOCKED <token>" and holds it
// until stdin closes or it is killed.
const delayChildRole = "lease-delay-holder"

const (
	envChildEndpoints = "LEASE_CHILD_ENDPOINTS"
	envChildLock      = "LEASE_CHILD_LOCK"
)

// runDelayChild is the child's main.
func runDelayChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := etcdproc.NewClient(strings.Split(os.Getenv(envChildEndpoints), ","))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(shortTTL), lease.WithLockDelay(lockDelay))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	l, err := s.Lock(ctx, os.Getenv(envChildLock))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("LOCKED %d\n", l.Token())
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	return 0
}

func TestWithLockDelayRefusesBadValues(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, lease.MaxLockDelay + time.Second} {
		_, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), etcd.Client(t), lease.WithLockDelay(d))
		if !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("WithLockDelay(%v): err = %v, want ErrInvalidArgument", d, err)
		}
	}
}

// delayCase ends the holding of a first session in some way, and says
// whether the waiter behind it must wait out the delay.
type delayCase struct {
	name    string
	delayed bool
	// end ends the holder's ownership and returns when it did so.
	end func(t *testing.T, cli *clientv3.Client, holder *lease.Session, l *lease.Lock) time.Time
}

var delayCases = []delayCase{
	{"unlock", false, func(t *testing.T, _ *clientv3.Client, _ *lease.Session, l *lease.Lock) time.Time {
		at := time.Now()
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		return at
	}},
	{"close", false, func(t *testing.T, _ *clientv3.Client, s *lease.Session, _ *lease.Lock) time.Time {
		at := time.Now()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return at
	}},
	{"lease revoked", true, func(t *testing.T, cli *clientv3.Client, s *lease.Session, _ *lease.Lock) time.Time {
		at := time.Now()
		if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease()); err != nil {
			t.Fatal(err)
		}
		return at
	}},
	{"key deleted by someone else", true, func(t *testing.T, cli *clientv3.Client, _ *lease.Session, l *lease.Lock) time.Time {
		at := time.Now()
		if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
			t.Fatal(err)
		}
		return at
	}},
}

func TestLockDelay(t *testing.T) {
	for _, tc := range delayCases {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcd.Client(t)
			name := etcdproc.Name(t, "delay")
			holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
			waiter := newSession(t, cli, lease.WithLockDelay(lockDelay))
			l := mustLock(t, holder, name)
			ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
			waitQueued(t, cli, name, 2)
			ended := tc.end(t, cli, holder, l)
			r := <-ch
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			waited := time.Since(ended)
			t.Logf("%s: granted %v after the end", tc.name, waited.Round(time.Millisecond))
			switch {
			case tc.delayed && waited < lockDelay:
				t.Errorf("granted %v after an involuntary loss, want at least %v", waited, lockDelay)
			case tc.delayed && waited > lockDelay+2*time.Second:
				t.Errorf("granted %v after an involuntary loss, far past the delay %v", waited, lockDelay)
			case !tc.delayed && waited > time.Second:
				t.Errorf("granted %v after a clean release: delayed", waited)
			}
			if err := r.l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A holder in another process is killed: its lease expires in etcd's own
// time, and the waiter is granted no sooner than the delay after that.
func TestLockDelayAfterExpiry(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-expiry")
	c, err := exampleenv.StartChild(etcdproc.Ctx(t, 30*time.Second), "holder", delayChildRole,
		envChildEndpoints+"="+strings.Join(etcd.Endpoints(), ","), envChildLock+"="+name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if _, err := c.Expect("LOCKED", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	waiter := newSession(t, cli, lease.WithLockDelay(lockDelay))
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
	waitQueued(t, cli, name, 2)
	gone := watchGone(t, cli, queueKeys(t, cli, name)[0])
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	expired := <-gone
	r := <-ch
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	granted := time.Now()
	t.Logf("killed → key expired %v → granted %v later", expired.Sub(killed).Round(time.Millisecond), granted.Sub(expired).Round(time.Millisecond))
	if d := granted.Sub(expired); d < lockDelay || d > lockDelay+2*time.Second {
		t.Errorf("granted %v after the expiry, want the delay %v (and not far past it)", d, lockDelay)
	}
	r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// watchGone reports when key is deleted.
func watchGone(t *testing.T, cli *clientv3.Client, key string) <-chan time.Time {
	t.Helper()
	wch := cli.Watch(etcdproc.Ctx(t, 30*time.Second), key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	<-wch
	ch := make(chan time.Time, 1)
	go func() {
		for wr := range wch {
			if len(wr.Events) > 0 {
				ch <- time.Now()
				return
			}
		}
	}()
	return ch
}

// During the delay the waiter keeps the head of the queue: a later Lock
// is not granted and a TryLock fails; the waiter's own loss ends its wait
// at once; and a waiter that gives up does not start the delay over.
func TestLockDelayKeepsPlace(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-place")
	holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
	first := newSession(t, cli, lease.WithLockDelay(lockDelay))
	second := newSession(t, cli, lease.WithLockDelay(lockDelay))
	third := newSession(t, cli, lease.WithLockDelay(lockDelay))
	mustLock(t, holder, name)
	firstCtx, giveUp := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer giveUp()
	firstCh := lockAsync(firstCtx, first, name)
	waitQueued(t, cli, name, 2)
	secondCh := lockAsync(etcdproc.Ctx(t, 30*time.Second), second, name)
	waitQueued(t, cli, name, 3)
	lost := time.Now()
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), holder.Lease()); err != nil {
		t.Fatal(err)
	}
	// The loss is recorded once the first waiter's turn comes.
	waitRecord(t, cli, name, "lost ")
	if _, err := third.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
		t.Errorf("TryLock during the delay: err = %v, want ErrLocked", err)
	}
	giveUp() // the first waiter gives up during the delay
	if r := <-firstCh; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("first waiter: err = %v, want context.Canceled", r.err)
	}
	r := <-secondCh
	if r.err != nil {
		t.Fatal(r.err)
	}
	waited := time.Since(lost)
	t.Logf("second waiter granted %v after the loss", waited.Round(time.Millisecond))
	if waited < lockDelay || waited > lockDelay+2*time.Second {
		t.Errorf("second waiter granted %v after the loss, want one delay (%v): the first one's giving up must not restart it", waited, lockDelay)
	}
}

func TestLockDelayWaiterLosesDuringDelay(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "delay-loss")
	holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
	waiter := newSession(t, cli, lease.WithLockDelay(lockDelay))
	mustLock(t, holder, name)
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
	waitQueued(t, cli, name, 2)
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), holder.Lease()); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, cli, name, "lost ")
	revoked := time.Now()
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), waiter.Lease()); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if !errors.Is(r.err, lease.ErrLost) {
		t.Fatalf("waiter whose lease went during the delay: err = %v, want ErrLost", r.err)
	}
	if d := time.Since(revoked); d > time.Second {
		t.Errorf("the waiter's loss ended its wait after %v", d)
	}
}

// waitRecord waits until name's delay record starts with prefix.
func waitRecord(t *testing.T, cli *clientv3.Client, name, prefix string) {
	t.Helper()
	key := lease.DelayRecordKey(name)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	wch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
	<-wch
	for {
		g, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) == 1 && strings.HasPrefix(string(g.Kvs[0].Value), prefix) {
			return
		}
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("delay record of %q never began with %q", name, prefix)
		}
	}
}

// A lock given up before it was handed to the caller turns a delay record
// that says it held the name (its own write of that record may have gone
// through with the answer lost) into a release, so that the next holder
// waits out no delay for it; a record about another holding is left as it
// is.
func TestGivenUpDelayedLockReleasesRecord(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("record-names-the-waiter=%v", own), func(t *testing.T) {
			cli := etcd.Client(t)
			name := etcdproc.Name(t, "delay-given-up")
			holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
			waiter := newSession(t, cli, lease.WithLockDelay(lockDelay))
			h := mustLock(t, holder, name)
			ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			ch := lockAsync(ctx, waiter, name)
			waitQueued(t, cli, name, 2)
			waitRecord(t, cli, name, "held ")
			token := h.Token()
			if own {
				g, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), fmt.Sprintf("%s/%x", name, int64(waiter.Lease())))
				if err != nil || len(g.Kvs) != 1 {
					t.Fatalf("the waiter's key: %v %v", g, err)
				}
				token = g.Kvs[0].CreateRevision
				if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), lease.DelayRecordKey(name), fmt.Sprintf("held %d %v", token, lockDelay)); err != nil {
					t.Fatal(err)
				}
			}
			cancel()
			if r := <-ch; r.err == nil {
				t.Fatal("a Lock whose ctx ended while it waited succeeded")
			}
			want := fmt.Sprintf("held %d %v", token, lockDelay)
			if own {
				want = fmt.Sprintf("released %d", token)
			}
			g, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), lease.DelayRecordKey(name))
			if err != nil || len(g.Kvs) != 1 {
				t.Fatalf("the delay record: %v %v", g, err)
			}
			if got := string(g.Kvs[0].Value); got != want {
				t.Errorf("delay record after the waiter gave up: %q, want %q", got, want)
			}
			mustUnlock(t, h)
		})
	}
}
