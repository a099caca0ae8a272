package lease

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
)

// Lock is one holding of a named lock by a Session. Its methods are safe for
// concurrent use.
//
// A Lock is held from the moment Lock or TryLock returns it until Done is
// closed. Ownership can end at any time without the holder's help (the lease
// expires, someone deletes the key), and a process can be paused past that
// point without noticing, so "Done is not closed" is never proof of
// ownership at the moment of a write. Pass Token to the resource and let it
// reject stale tokens (package fence).
type Lock struct {
	s     *Session
	name  string
	key   string
	token int64

	// ctx ends, with the reason as its cause, when ownership ends: it is
	// the lock's whole public state (Done, Err, Context). monitorDone is
	// closed once the monitor goroutine has stopped.
	ctx         context.Context
	cancel      context.CancelCauseFunc
	monitorDone chan struct{}

	writing sync.Mutex // one write of the key at a time: Unlock, Resign, Proclaim

	mu    sync.Mutex // guards the fields below
	phase phase
	gate  func() // gives the name's local gate back; nil once given back
	value string // the key's value: empty for a lock, the leader's for a campaign
	// grantedAt is when the lock was handed to the caller (zero before);
	// monitorStopped is set as the monitor stops. Whichever of the two
	// comes second reports the lock's end (reportGranted, monitorStops).
	grantedAt      time.Time
	monitorStopped bool
}

// phase is what the lock is doing with its key while it is held.
type phase int

const (
	steady          phase = iota // no release in flight
	releasing                    // an Unlock has sent its delete
	releasedOrTaken              // ... and the monitor saw the key go
)

// Name is the lock's name, as given to Lock.
func (l *Lock) Name() string { return l.name }

// Key is the etcd key that holds the lock: Name() + "/" + the lease ID in
// hex.
func (l *Lock) Key() string { return l.key }

// Token is the fencing token: the creation revision of the lock key. Every
// later holder of the same name has a strictly larger token, across etcd
// leader changes. Tokens of different names are unrelated.
func (l *Lock) Token() int64 { return l.token }

// Done is closed when ownership ends, for whatever reason: Unlock, Close of
// the session, expiry of the lease, or deletion or replacement of the key.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lock is held. After Done is closed it says why:
// ErrUnlocked, ErrSessionClosed, or an error wrapping ErrLost
// (ErrLeaseExpired or ErrKeyDeleted) for an involuntary loss.
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Context returns a context derived from parent that is also cancelled when
// ownership ends, with the lock's Err as its cause (context.Cause). Use it
// for work done under the lock. Call cancel when the work is done.
func (l *Lock) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return linkCause(parent, l.ctx)
}

// WriteContext returns a context for a fenced write made under the lock. It
// carries parent's values but does not end when parent ends, nor when the
// lock ends: a write under way when the lock is lost must still reach the
// resource, whose fence says whether it counts (a stale token is refused
// with a typed error), instead of being cancelled into an outcome nobody
// knows. It ends after the session's TTL, so that no write outlives the
// lease by much. Call cancel when the write is done.
func (l *Lock) WriteContext(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), l.s.ttl)
}

// Lock takes the lock name, waiting until it is held or ctx ends. Locks of
// the same name taken through the same session exclude each other.
//
// On any failure the waiter's key is removed before Lock returns (a guarded
// delete, bounded by the TTL), so a failed Lock never leaves a key that
// would hold up later waiters. A waiter whose own key or session vanishes
// returns at once, with an error wrapping ErrLost or ErrSessionClosed. A
// waiter whose ctx ends gets an error that names the key it was waiting
// behind and matches ctx's error (context.DeadlineExceeded or
// context.Canceled).
func (s *Session) Lock(ctx context.Context, name string) (*Lock, error) {
	l, err := s.acquire(ctx, name, "", false)
	if err != nil {
		return nil, failed(fmt.Sprintf("lock %q", name), err)
	}
	return l, nil
}

// TryLock takes the lock name if nobody holds it, and returns an error
// wrapping ErrLocked at once otherwise, naming the holder's key and token
// (or saying that this same session holds it). A failed TryLock leaves no
// key behind: when the lock is held it writes nothing at all.
func (s *Session) TryLock(ctx context.Context, name string) (*Lock, error) {
	l, err := s.acquire(ctx, name, "", true)
	if err != nil {
		return nil, failed(fmt.Sprintf("trylock %q", name), err)
	}
	return l, nil
}

// acquire queues a key holding value under name and waits for its turn:
// the common path of Lock, TryLock and Campaign.
func (s *Session) acquire(ctx context.Context, name, value string, try bool) (*Lock, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := s.alive(); err != nil {
		return nil, err
	}
	release, err := s.gates.enter(ctx, s.ctx, name, try)
	if err != nil {
		return nil, err
	}
	l := &Lock{s: s, name: name, key: lockKey(name, s.id), value: value, gate: release}
	held, err := l.queue(ctx, try)
	if err != nil {
		return nil, err
	}
	if err := l.start(); err != nil {
		return nil, err
	}
	if !held {
		if err := l.await(ctx, try); err != nil {
			l.abandon()
			return nil, err
		}
	}
	l.reportGranted(time.Since(start))
	return l, nil
}

// queue puts the lock's key, with requests that end with the session too:
// a waiter whose lease is gone must not sit in a request until ctx ends.
func (l *Lock) queue(ctx context.Context, try bool) (held bool, err error) {
	cctx, stop := l.s.bound(ctx)
	held, err = l.create(cctx, try)
	stop()
	if err != nil {
		l.leave()
		if l.s.ctx.Err() != nil {
			err = context.Cause(l.s.ctx)
		}
		return false, err
	}
	return held, nil
}

// start gives the queued lock its own context and its monitor, registered
// with the session so that Close waits for it.
func (l *Lock) start() error {
	l.ctx, l.cancel = context.WithCancelCause(l.s.ctx)
	if err := l.s.track(); err != nil {
		l.abandon()
		return err
	}
	l.monitorDone = make(chan struct{})
	go l.monitor(l.token + 1)
	return nil
}

// await waits for the lock's turn; with try set, it only looks again
// whether the queue ahead is empty (reached when nested locks' keys hid
// the queue from create's first read).
func (l *Lock) await(ctx context.Context, try bool) error {
	if try {
		pred, err := l.predecessor(ctx)
		if err == nil && pred != nil {
			err = lockedBy(pred)
		}
		return err
	}
	l.s.hooks.waiting(l.name, +1)
	defer l.s.hooks.waiting(l.name, -1)
	wctx, stop := l.Context(ctx)
	err := l.wait(wctx)
	stop()
	if err != nil && l.ctx.Err() != nil {
		err = context.Cause(l.ctx)
	}
	return err
}

// lockedBy is TryLock's error when kv holds the lock.
func lockedBy(kv *mvccpb.KeyValue) error {
	return fmt.Errorf("%w: %s (token %d)", ErrLocked, kv.Key, kv.CreateRevision)
}

const queuePage = 16

// create puts the lock key and tells whether it is already the holder. With
// try set it first tries to take the lock only if no key at all exists under
// the name, so that a held lock costs TryLock no write.
func (l *Lock) create(ctx context.Context, try bool) (held bool, err error) {
	cli, pfx := l.s.client, l.name+"/"
	put := clientv3.OpPut(l.key, l.value, clientv3.WithLease(l.s.id))
	if try {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()).
			Then(put).
			Else(oldestFirst(pfx)).
			Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			l.token = resp.Header.Revision
			return true, nil
		}
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			if isQueueKey(pfx, kv) {
				return false, lockedBy(kv)
			}
		}
		// Only keys of nested locks were seen: queue up, then look again.
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)).
		Then(put, oldestFirst(pfx)).
		Commit()
	if err != nil {
		// Unless etcd refused it outright, the put may have been applied:
		// remove it if so, by lease, since its revision is unknown.
		if !rpcerr.Definite(err) {
			l.cleanup(clientv3.Compare(clientv3.LeaseValue(l.key), "=", int64(l.s.id)))
		}
		return false, err
	}
	if !resp.Succeeded {
		return false, fmt.Errorf("%w: %s", ErrKeyInUse, l.key)
	}
	l.token = resp.Header.Revision
	l.s.probeKey.Store(l.key)
	l.s.sawRevision(resp.Header.Revision)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if isQueueKey(pfx, kv) {
			return kv.CreateRevision == l.token, nil
		}
	}
	return false, nil // only other keys in the first page: wait reads on
}

// oldestFirst reads the first page of the keys under pfx, oldest first.
// Not keys-only: the queue-key rule needs each key's lease, which etcd 3.7
// leaves empty in a keys-only read. Lock keys have empty values, so this
// costs only the values of other keys kept under the name.
func oldestFirst(pfx string) clientv3.Op {
	return clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithLimit(queuePage),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// wait blocks until every older key in the queue is gone, watching only the
// nearest older one, as etcd's Mutex does, but with a watch that etcd
// serves at once rather than one it catches up on a 100 ms timer. If ctx
// ends, the error names the key it was waiting behind.
func (l *Lock) wait(ctx context.Context) error {
	retry := newBackoff(10*time.Millisecond, time.Second)
	for {
		pred, err := l.predecessor(ctx)
		if err == nil && pred == nil {
			return nil
		}
		gone := false
		if err == nil {
			gone, err = l.waitGone(ctx, pred)
		}
		if err != nil && !rpcerr.Transient(ctx, err) {
			return behind(pred, err)
		}
		if gone {
			retry.reset()
			continue
		}
		// The watch broke without seeing the key go, or etcd could not be
		// reached for a moment: look again shortly. The waiter's key stays
		// queued, and the session's deadline bounds how long this goes on.
		if err := retry.wait(ctx); err != nil {
			return behind(pred, err)
		}
	}
}

// behind says which key a waiter was waiting behind when err ended it.
func behind(pred *mvccpb.KeyValue, err error) error {
	if pred == nil {
		return err
	}
	return fmt.Errorf("waiting behind %s (token %d): %w", pred.Key, pred.CreateRevision, err)
}

// predecessor returns the newest queue key older than the lock's own, or nil
// if there is none and the lock is held. In the same read it checks that the
// lock's own key is still there with its token: a waiter whose key vanished
// must never be told it holds the lock.
func (l *Lock) predecessor(ctx context.Context) (*mvccpb.KeyValue, error) {
	cli, pfx := l.s.client, l.name+"/"
	older := func(maxRev int64) clientv3.Op {
		return clientv3.OpGet(pfx, clientv3.WithPrefix(), // not keys-only: see oldestFirst
			clientv3.WithMaxCreateRev(maxRev), clientv3.WithLimit(queuePage),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
	}
	maxRev := l.token - 1
	if maxRev <= 0 { // WithMaxCreateRev(0) means no bound
		return nil, nil
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(l.key), older(maxRev)).Commit()
	if err != nil {
		return nil, err
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	if !l.ownsFirst(own) {
		return nil, ErrKeyDeleted
	}
	page := resp.Responses[1].GetResponseRange()
	for {
		for _, kv := range page.Kvs {
			if isQueueKey(pfx, kv) {
				return kv, nil
			}
			maxRev = kv.CreateRevision - 1
		}
		if !page.More || maxRev <= 0 {
			return nil, nil
		}
		// Only nested locks' keys so far: read on, older.
		r, err := cli.Do(ctx, older(maxRev))
		if err != nil {
			return nil, err
		}
		page = (*pb.RangeResponse)(r.Get())
	}
}

// waitGone waits until pred is deleted. It opens the watch at the current
// revision (served at once), waits for etcd to confirm it, and only then
// reads pred again, so a deletion between the first read and the watch is
// never missed. It reports false if the watch ended without seeing pred go.
func (l *Lock) waitGone(ctx context.Context, pred *mvccpb.KeyValue) (bool, error) {
	cli := l.s.client
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, string(pred.Key), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil || !wr.Created {
			return false, ctx.Err()
		}
	case <-l.ctx.Done():
		return false, context.Cause(l.ctx)
	case <-ctx.Done():
		return false, ctx.Err()
	}
	g, err := cli.Get(ctx, string(pred.Key), clientv3.WithKeysOnly())
	if err != nil {
		return false, err
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
		return true, nil
	}
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return false, ctx.Err()
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return true, nil
				}
			}
		case <-l.ctx.Done():
			return false, context.Cause(l.ctx)
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// monitor watches the lock's own key from fromRev on, and ends the lock if
// the key is deleted or replaced. Together with the session's lease
// deadline it is what closes Done.
func (l *Lock) monitor(fromRev int64) {
	defer l.s.wg.Done()
	defer close(l.monitorDone)
	defer l.monitorStops()
	defer l.leave()
	rev := fromRev
	retry := newBackoff(50*time.Millisecond, time.Second)
	for l.ctx.Err() == nil {
		next, lost := l.watchOwn(rev)
		if lost {
			l.keyGone()
			return
		}
		rev = next
		// The watch ended (compaction, no leader, lost connection): read
		// the key afresh and watch on from that read.
		if retry.wait(l.ctx) != nil {
			return
		}
		g, err := l.s.client.Get(l.ctx, l.key)
		if err != nil {
			continue
		}
		if !l.ownsFirst(g.Kvs) {
			l.keyGone()
			return
		}
		rev = g.Header.Revision + 1
	}
}

// watchOwn watches the lock's key from rev until the watch ends or an
// event shows that the key is no longer this holding's. It returns the
// revision to watch on from.
func (l *Lock) watchOwn(rev int64) (next int64, lost bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(l.ctx))
	defer cancel()
	for wr := range l.s.client.Watch(wctx, l.key, clientv3.WithRev(rev)) {
		if wr.Err() != nil {
			break
		}
		for _, ev := range wr.Events {
			rev = ev.Kv.ModRevision + 1
			if !l.owns(ev.Kv) { // a delete event's key has no creation revision
				return rev, true
			}
		}
	}
	return rev, false
}

// ownsFirst is owns for the result of a read of the lock's key.
func (l *Lock) ownsFirst(kvs []*mvccpb.KeyValue) bool {
	var kv *mvccpb.KeyValue
	if len(kvs) > 0 {
		kv = kvs[0]
	}
	return l.owns(kv)
}

// keyGone records that the key went away. If an Unlock is in flight, its
// own outcome decides how the lock ended; the monitor only waits for it.
func (l *Lock) keyGone() {
	l.mu.Lock()
	if l.phase != steady {
		l.phase = releasedOrTaken
		l.mu.Unlock()
		<-l.ctx.Done()
		return
	}
	l.mu.Unlock()
	l.cancel(ErrKeyDeleted) // logged, with every other end, by reportGranted
}

// leave hands the name's local gate on, once.
func (l *Lock) leave() {
	l.mu.Lock()
	release := l.gate
	l.gate = nil
	l.mu.Unlock()
	if release != nil {
		release()
	}
}

// abandon gives up a lock that was never handed to the caller: its key is
// removed if it still carries the token, and its monitor is stopped.
func (l *Lock) abandon() {
	l.cleanup(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token))
	l.cancel(ErrUnlocked)
	if l.monitorDone != nil {
		<-l.monitorDone
	} else {
		l.leave()
	}
}

// cleanup deletes the lock key if cmp holds, with its own deadline of one
// TTL: the caller's ctx may be what failed. If etcd cannot be reached for
// that long, the lease expires and takes the key with it.
func (l *Lock) cleanup(cmp clientv3.Cmp) {
	ctx, cancel := context.WithTimeout(context.Background(), l.s.ttl)
	defer cancel()
	retry := newBackoff(20*time.Millisecond, time.Second)
	for {
		_, err := l.s.client.Txn(ctx).If(cmp).Then(clientv3.OpDelete(l.key)).Commit()
		if err == nil {
			return
		}
		if retry.wait(ctx) != nil {
			l.s.lg.Error("lock key left for the lease to remove", zap.String("key", l.key), zap.Error(err))
			return
		}
	}
}

// Unlock releases the lock: it deletes the key only if the key's creation
// revision is still the token, so it can never remove a later holder's key,
// even when a retry of it arrives late. Done closes with ErrUnlocked.
//
// If the lock has already ended, Unlock sends nothing and returns an error
// saying how: wrapping ErrUnlocked, ErrSessionClosed or ErrLost. If the key
// was found gone or replaced, the error wraps ErrKeyDeleted. If etcd did not
// answer, the error is etcd's and the lock is still considered held: Unlock
// may be called again.
func (l *Lock) Unlock(ctx context.Context) error {
	if err := l.unlock(ctx); err != nil {
		return failed(fmt.Sprintf("unlock %q", l.name), err)
	}
	return nil
}

func (l *Lock) unlock(ctx context.Context) error {
	l.writing.Lock()
	defer l.writing.Unlock()
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	l.setPhase(releasing)
	resp, err := l.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)).
		Then(clientv3.OpDelete(l.key)).
		Commit()

	l.mu.Lock()
	released := (err == nil && resp.Succeeded) || (err != nil && l.phase == releasedOrTaken)
	if released {
		// Before the phase goes back: the monitor may see our own delete
		// at any moment after, and must not call it a loss.
		l.cancel(ErrUnlocked)
	}
	l.phase = steady
	l.mu.Unlock()
	switch {
	case released:
		l.end(ErrUnlocked)
		return nil
	case err == nil:
		l.end(ErrKeyDeleted)
		return ErrKeyDeleted
	default:
		return err
	}
}

// put sets the key's value, guarded by its creation revision: it never
// creates a key, and never touches a successor's. A key found gone ends
// the lock with ErrKeyDeleted.
func (l *Lock) put(ctx context.Context, value string) error {
	l.writing.Lock()
	defer l.writing.Unlock()
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	resp, err := l.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)).
		Then(clientv3.OpPut(l.key, value, clientv3.WithLease(l.s.id))).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		l.end(ErrKeyDeleted)
		return context.Cause(l.ctx)
	}
	l.mu.Lock()
	l.value = value
	l.mu.Unlock()
	return nil
}

// currentValue is the value the key was last given.
func (l *Lock) currentValue() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

func (l *Lock) setPhase(p phase) {
	l.mu.Lock()
	l.phase = p
	l.mu.Unlock()
}

// end ends the lock with cause and waits for its monitor.
func (l *Lock) end(cause error) {
	l.cancel(cause)
	<-l.monitorDone
}
