package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
	mode  Mode

	// ctx ends, with the reason as its cause, when ownership ends: it is
	// the lock's whole public state (Done, Err, Context). finished is
	// closed once the lock has finished after that (finish).
	ctx      context.Context
	cancel   context.CancelCauseFunc
	finished chan struct{}
	// stopFinish keeps finish from starting on a goroutine of its own
	// once ctx ends, and reports whether it did (see cancelWith).
	stopFinish func() bool

	w       watches       // the name's watches, which deliver deletions
	changed chan struct{} // poked when the keys ahead may have changed

	writing sync.Mutex // one write of the key at a time: Unlock, Resign, Proclaim

	mu   sync.Mutex // guards hold and q
	hold keyState
	q    waiting
}

// keyState is a lock's key and its holding, as the caller sees them.
// Lock.mu guards it.
type keyState struct {
	phase phase
	gate  func() // gives the name's local gate back; nil once given back
	value string // the key's value: empty for a lock, the leader's for a campaign
	// grantedAt is when the lock was handed to the caller (zero before);
	// finishedEnd is set as the lock finishes. Whichever of the two
	// comes second reports the lock's end (reportGranted, finishing).
	grantedAt   time.Time
	finishedEnd bool
	granted     bool // the rule granted the lock: it is (or was) held
	// watchOwn opens the own-key watch once the lock has been held for
	// ownWatchDelay, when it was granted with that watch not up.
	watchOwn *time.Timer
}

// waiting is what a lock knows of its queue, and how it waits for its
// turn. Lock.mu guards it.
type waiting struct {
	// know is what the lock knows of its queue, fed by every read and
	// watch, and the one rule that decides its grant (knowledge.go). The
	// fields below only choose how to wait and what to read.
	know *knowledge
	// sharing counts the queue keys older than the lock's own that do not
	// block it (for a reader, other readers' keys), as of the last read:
	// their deletions, too, reach a waiter that follows the queue watch.
	sharing int
	// mirrored: the lock waits on its Keeper's copy of the queue
	// (viewFromMirror), which is a snapshot for the rule as it looks.
	mirrored bool
	// far: the lock waited far back in the queue, following only the
	// newest keys ahead through watches of single keys (follows); it does
	// so until it is granted. followEpochs are those watches' epochs as
	// the view was read, or as follow confirmed a key; listed is how many
	// keys were ahead then: fewer now means a followed key went, and the
	// view must be read again.
	far          bool
	listed       int
	followEpochs map[string]uint64
	epoch        uint64 // of the queue watch, as the view was read
	ownEpoch     uint64 // of the own-key watch, as the view was read
	// fresh: the view is the one read as the key was put (or the
	// Keeper's copy as it took the put), and not yet looked at.
	fresh bool
	// atOnce: the lock was granted at its first look, by the view read
	// with its put or by the Keeper's copy as it took the put; onlyKey:
	// the copy then held no other key under the name. See restQueue and
	// restOwn.
	atOnce, onlyKey bool
}

// phase is what the lock is doing with its key while it is held.
type phase int

const (
	steady          phase = iota // no release in flight
	releasing                    // an Unlock has sent its delete
	releasedOrTaken              // ... and the own-key watch saw the key go
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
// By then the end has been logged and reported to the session's Hooks. A
// deletion of the key in the first 50 ms of a lock granted at once is seen
// at their end (see the package doc).
func (l *Lock) Done() <-chan struct{} { return l.finished }

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
// delete, tried until it is done or the session ends), so a failed Lock
// never leaves a key that would hold up later waiters while the session
// lives. The key's write is not cut off by ctx (a write cut off may still
// be applied after the cleanup): if ctx ends while it is under way, Lock
// waits for etcd's answer (or the session's end, within a TTL if etcd is
// unreachable) and then removes the key. A waiter whose own key or session
// vanishes returns at once, with an error wrapping ErrLost or
// ErrSessionClosed. A waiter whose ctx ends gets an error that names the
// key it was waiting behind and matches ctx's error
// (context.DeadlineExceeded or context.Canceled).
func (s *Session) Lock(ctx context.Context, name string) (*Lock, error) {
	l, err := s.acquire(ctx, name, Write, "", false)
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
	l, err := s.acquire(ctx, name, Write, "", true)
	if err != nil {
		return nil, failed(fmt.Sprintf("trylock %q", name), err)
	}
	return l, nil
}

// acquire queues a key holding value under name and waits for its turn in
// mode: the common path of Lock, TryLock, RLock, TryRLock and Campaign.
// A reader's value is ReaderValue.
func (s *Session) acquire(ctx context.Context, name string, mode Mode, value string, try bool) (*Lock, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := s.alive(); err != nil {
		return nil, err
	}
	w, release, err := s.enterGate(ctx, name, try)
	if err != nil {
		return nil, err
	}
	if mode == Read {
		value = ReaderValue
	}
	l := &Lock{s: s, name: name, key: lockKey(name, s.id), mode: mode, w: w}
	l.hold.value, l.hold.gate = value, release
	l.q.know = newKnowledge(l.key, l.owns)
	if err := l.start(); err != nil {
		return nil, err
	}
	if err := l.queue(ctx, try); err != nil {
		l.end(ErrUnlocked) // nothing of it is left in etcd: see create
		return nil, err
	}
	if err := l.await(ctx, try); err != nil {
		l.abandon()
		return nil, err
	}
	if err := l.waitDelay(ctx); err != nil {
		l.abandon()
		return nil, err
	}
	l.restQueue()
	l.s.hold(l)
	l.reportGranted(time.Since(start))
	return l, nil
}

// start gives the lock its own context, registered with the session so
// that Close waits for the lock to finish, and makes it the subscriber of
// its name's watches. It does not wait for the own-key watch: a lock
// granted as its key is put needs it only once held for ownWatchDelay,
// and a waiter opens it before it relies on its view (look).
func (l *Lock) start() error {
	l.ctx, l.cancel = context.WithCancelCause(l.s.ctx)
	l.changed = make(chan struct{}, 1)
	l.finished = make(chan struct{})
	if err := l.s.track(); err != nil {
		l.cancel(err)
		l.leave()
		return err
	}
	l.stopFinish = context.AfterFunc(l.ctx, l.finish)
	ownEpoch := l.subscribeTo(l.w.own)
	epoch := l.subscribeTo(l.w.queue)
	follows := l.w.follows.subscribe(l)
	l.mu.Lock()
	l.q.ownEpoch, l.q.epoch, l.q.followEpochs = ownEpoch, epoch, follows
	l.mu.Unlock()
	return nil
}

// finish runs once the lock has ended: its events stop, the name's gate is
// handed on, and the end is reported.
func (l *Lock) finish() {
	defer l.s.wg.Done()
	defer close(l.finished)
	l.mu.Lock()
	if l.hold.watchOwn != nil {
		l.hold.watchOwn.Stop()
	}
	token := l.token
	l.mu.Unlock()
	l.w.own.unsubscribe(l)
	l.w.queue.unsubscribe(l)
	l.w.follows.unsubscribe(l)
	if m := l.w.queue.mirror; m != nil {
		m.leave(l, token)
	}
	l.s.unhold(l)
	l.leave()
	l.finishing()
}

// queue puts the lock's key, with requests that end with the session too:
// a waiter whose lease is gone must not sit in a request until ctx ends.
func (l *Lock) queue(ctx context.Context, try bool) error {
	cctx, stop := l.s.bound(ctx)
	err := l.create(cctx, try)
	stop()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// etcd knows the lease is gone (revoked, or expired) before the
		// keep-alives have told the session: end it now, so that this
		// call and every later one say so.
		l.s.lose("etcd refused a put on the lease: lease not found")
	}
	if err != nil && l.s.ctx.Err() != nil {
		err = context.Cause(l.s.ctx)
	}
	return err
}

// await waits for the lock's turn; with try set, it only looks whether the
// queue ahead is empty (reached when nested locks' keys hid the queue from
// create's first read).
func (l *Lock) await(ctx context.Context, try bool) error {
	switch v := l.look(); {
	case v.held():
		return nil
	case v.ended:
		return context.Cause(l.ctx)
	}
	if !try {
		l.s.hooks.waiting(l.name, +1)
		defer l.s.hooks.waiting(l.name, -1)
	}
	wctx, stop := l.Context(ctx)
	err := l.wait(wctx, try)
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

// queuePage is how many keys one read of a queue returns: the oldest, for
// TryLock's holder, or the ones just older than a waiter's own key.
const queuePage = 16

// sharedPage is queuePage for a lock whose queue watch a Keeper shares,
// when it reads its view instead of taking it from the Keeper's copy (no
// copy yet, or the watch restarted): such a waiter follows every deletion
// ahead at no cost per waiter, so it reads the whole queue ahead (up to
// this many keys) and then needs no read to be granted, however long the
// queue. etcd reads the whole range to sort it either way.
const sharedPage = 1024

// page is how many keys ahead the lock's reads return.
func (l *Lock) page() int64 {
	if l.w.shared != nil {
		return sharedPage
	}
	return queuePage
}

// nearAhead is how many keys ahead a waiter may have and still follow
// every deletion in the queue through the queue watch. Further back it
// follows only the two newest keys ahead (followKeys): otherwise every
// deletion would reach every waiter of a long queue. A reader counts the readers'
// keys ahead too, though they do not block it: readers behind a writer
// that followed every reader's deletion were sent so many events (with 16
// sessions on one client) that etcd moved their watchers to its 100 ms
// catch-up loop, and a reader's p99 wait was 100 ms.
const nearAhead = 3

// create puts the lock key and reads the keys queued just ahead of it. With
// try set it first tries to take the lock only if no key at all exists under
// the name, so that a held lock costs TryLock no write.
func (l *Lock) create(ctx context.Context, try bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The writes go out under the session, not under ctx: a put cut off
	// by ctx may still be applied after the cleanup that follows, and
	// leave a key that no lock of the session owns at the head of the
	// queue for as long as the session lives. So the put waits for etcd's
	// answer, or for the session's end (which takes the key with it: a
	// session whose keep-alives go unanswered ends within its TTL). If ctx
	// ends meanwhile, the key is removed once the outcome is known.
	err := l.enqueue(ctx, l.s.ctx, try)
	if err == nil && l.token != 0 && ctx.Err() != nil {
		l.cleanup(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token))
		return ctx.Err()
	}
	return err
}

// enqueue is create's work: its writes use wctx, its waits ctx.
func (l *Lock) enqueue(ctx, wctx context.Context, try bool) error {
	cli, pfx := l.s.client, l.name+"/"
	put := clientv3.OpPut(l.key, l.hold.value, clientv3.WithLease(l.s.id))
	if try {
		if done, err := l.tryEmpty(wctx, put); done || err != nil {
			return err
		}
		// Only keys of nested locks (or, for a reader, of readers) were
		// seen: queue up, then look again.
	}
	// A Keeper's watch at rest (keyWatch.granted) keeps no copy: the
	// enqueue then reads, as a session's own would.
	mirrored := !try && l.w.queue.mirror != nil && !l.w.queue.isPaused()
	then := []clientv3.Op{put}
	if !mirrored {
		then = append(then, newestFirst(pfx, 0, l.page()+1))
	}
	resp, err := cli.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)).
		Then(then...).
		Commit()
	if err != nil {
		// Unless etcd refused it outright, the put may have been applied:
		// remove it if so, by lease, since its revision is unknown.
		if !rpcerr.Definite(err) {
			l.cleanup(clientv3.Compare(clientv3.LeaseValue(l.key), "=", int64(l.s.id)))
		}
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s", ErrKeyInUse, l.key)
	}
	l.setToken(resp.Header.Revision)
	l.s.probeKey.Store(l.key)
	l.s.sawRevision(resp.Header.Revision)
	l.queued(ctx, resp, mirrored)
	return nil
}

// queued takes the view from the answer of the put that queued the lock,
// or from the Keeper's copy.
func (l *Lock) queued(ctx context.Context, resp *clientv3.TxnResponse, mirrored bool) {
	if mirrored {
		l.viewFromMirror(ctx)
		return
	}
	// The page holds the new key itself, the newest under the name.
	l.setAhead(resp.Header.Revision, resp.Responses[1].GetResponseRange())
}

// tryEmpty puts the key only if no key at all is under the name, for
// TryLock, so that a held lock costs it no write. done reports that it
// was put (and the lock is held), or that a key that blocks it was found
// (err wraps ErrLocked); otherwise only keys that do not block it were
// found, and it queues as Lock does.
func (l *Lock) tryEmpty(wctx context.Context, put clientv3.Op) (done bool, err error) {
	pfx := l.name + "/"
	resp, err := l.s.client.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()).
		Then(put).
		Else(oldestFirst(pfx)).
		Commit()
	if err != nil {
		if !rpcerr.Definite(err) {
			l.cleanup(clientv3.Compare(clientv3.LeaseValue(l.key), "=", int64(l.s.id)))
		}
		return true, err
	}
	if resp.Succeeded {
		l.setToken(resp.Header.Revision)
		l.setAhead(resp.Header.Revision, nil)
		return true, nil
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if isQueueKey(pfx, kv) && l.blocks(kv) {
			return true, lockedBy(kv)
		}
	}
	return false, nil
}

// setToken records the lock's token as its key's put returns, and marks
// the view about to be set as read with that put (fresh). Under l.mu: the
// watches' deletions and a finish started by the session's end read the
// token on goroutines of their own.
func (l *Lock) setToken(token int64) {
	l.mu.Lock()
	l.token, l.q.fresh = token, true
	l.q.know.setToken(token)
	l.mu.Unlock()
}

// viewFromMirror makes the lock wait on its Keeper's copy of the queue,
// once the copy has applied the lock's own put, in the watch epoch the lock
// subscribed in: the copy tells it when nothing blocks it any more, and
// wakes it only then, so that a deletion costs nothing per waiter. The
// lock then takes no deletions from the queue watch. Without such a copy
// the view stays unread, and wait reads it.
func (l *Lock) viewFromMirror(ctx context.Context) {
	l.mu.Lock()
	epoch := l.q.epoch
	l.mu.Unlock()
	if !l.w.queue.mirror.join(ctx, l.ctx.Done(), epoch, l) {
		return
	}
	l.w.queue.unsubscribe(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.mirrored = true
}

// leaveMirror makes a lock that waited on its Keeper's copy of the queue
// take the queue watch's deletions again, as it reads its view: the copy
// is gone (the watch went down) or the own-key watch restarted.
func (l *Lock) leaveMirror() {
	l.mu.Lock()
	was, token := l.q.mirrored, l.token
	l.q.mirrored = false
	l.mu.Unlock()
	if was {
		l.w.queue.mirror.leave(l, token)
		l.subscribeTo(l.w.queue)
	}
}

// oldestFirst reads the first page of the keys under pfx, oldest first.
// Not keys-only: the queue-key rule needs each key's lease, which etcd 3.7
// leaves empty in a keys-only read. Lock keys have empty values, so this
// costs only the values of other keys kept under the name.
func oldestFirst(pfx string) clientv3.Op {
	return clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithLimit(queuePage),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// newestFirst reads up to limit keys under pfx created before maxRev (any,
// if maxRev is 0), newest first; not keys-only, as for oldestFirst.
func newestFirst(pfx string, maxRev int64, limit int64, opts ...clientv3.OpOption) clientv3.Op {
	opts = append(opts, clientv3.WithPrefix(), clientv3.WithLimit(limit),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
	if maxRev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(maxRev))
	}
	return clientv3.OpGet(pfx, opts...)
}

// setAhead makes page, read at store revision rev together with the
// lock's own key (found this holding's), the rule's snapshot: the keys
// older than the lock's own that block it. page may hold the lock's own
// key, keys of nested locks and other keys under the name, which do not
// block; a page of keys that do not block is followed by older pages
// (readView), and a key's kind is fixed when it is made, so the last
// page's listing stands for the pages before it.
func (l *Lock) setAhead(rev int64, page *pb.RangeResponse) {
	pfx := l.name + "/"
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.sharing = 0
	var listed []*mvccpb.KeyValue
	older := 0
	if page != nil {
		for _, kv := range page.Kvs {
			if kv.CreateRevision >= l.token {
				continue
			}
			older++
			switch {
			case isQueueKey(pfx, kv) && l.blocks(kv):
				listed = append(listed, kv)
			case isQueueKey(pfx, kv):
				l.q.sharing++
			}
		}
	}
	// The page ended before the oldest key: older ones may be past it.
	complete := page == nil || !page.More || older == 0
	l.q.know.snapshot(rev, l.ownKV(), listed, complete)
	l.q.listed = len(l.q.know.ahead)
}

// deleted is called by a watch of the name with the events of one
// response, in revision order, in the watch's epoch. The rule takes them
// all, whatever the source, and the waiter looks again; a change of the
// own key after the token ends a held lock here (a waiter's end is the
// rule's to decide).
func (l *Lock) deleted(w *keyWatch, events []*clientv3.Event, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.feed(w, events, epoch)
	defer l.poke()
	if l.token == 0 {
		return // the rule keeps the own key's events until the token is known
	}
	for _, ev := range events {
		if string(ev.Kv.Key) == l.key {
			l.ownChanged(ev)
		}
	}
}

// ownChanged ends the lock if ev, a change of its own key after the
// token, deleted it, made it another holding's or moved it off the
// session's lease (a put by someone else: the key no longer goes with the
// session). A delete event's key has no creation revision or lease: not
// ours (unless a mutant says so). l.mu is held.
func (l *Lock) ownChanged(ev *clientv3.Event) {
	if ev.Kv.ModRevision > l.token && !l.owns(ownAfter(ev)) {
		l.keyGoneLocked()
	}
}

// ownAfter is the own key as ev left it: nil if deleted.
func ownAfter(ev *clientv3.Event) *mvccpb.KeyValue {
	if ev.Type == mvccpb.DELETE {
		return nil
	}
	return ev.Kv
}

// poke wakes the waiter, if any, to look at the lock's view again.
func (l *Lock) poke() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// keyGoneLocked records that the lock's key was deleted. If an Unlock is
// in flight, its own outcome decides how the lock ended. l.mu is held.
func (l *Lock) keyGoneLocked() {
	if l.hold.phase != steady {
		l.hold.phase = releasedOrTaken
		return
	}
	l.cancel(ErrKeyDeleted) // logged, with every other end, by reportGranted
}

// view is what a waiter knows of the queue ahead of it: the rule's
// decision (l.q.know), and what the waiter needs to choose how to wait or
// what to read next.
type view struct {
	d        decision         // the rule's: granted, lost, wait, or read at d.rev or later
	ended    bool             // the lock has ended (see its context's cause): it is never held
	unread   bool             // no read of the queue has been taken yet
	ownStale bool             // the own-key watch was not up all along since the view was read
	near     bool             // few enough ahead (or only readers) to follow every deletion, or a Keeper shares the watch
	current  bool             // the queue watch has kept the view current since it was read
	far      bool             // the lock follows only the newest keys ahead (see Lock.far)
	followed bool             // ... and their watches keep the view current
	refollow bool             // ... and one of them went: the view must be read again
	pred     *mvccpb.KeyValue // the nearest key ahead; nil if the view holds none
	mirrored bool             // the lock waits on its Keeper's copy of the queue, which is up
}

func (v view) held() bool { return v.d.kind == decideGranted }

// look asks the rule whether the lock is held, and gathers what the
// waiter needs to act on its answer. Once granted, the lock counts as
// held from then on, for recheck: no key older than the lock's own can
// appear later, and the own-key watch reports the own key's end.
//
// A lock granted by the view read with its put may have its own-key
// watch down: it is opened once the lock has been held for
// ownWatchDelay, and reads the key again as it comes up (recheck). A lock
// held for less opens no watch: the event its own Unlock would send it is
// the largest cost of an uncontended lock after the requests themselves.
func (l *Lock) look() view {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		// The lock ended while it waited (its key deleted, its session
		// gone): it must not be granted, whatever its view says.
		return view{ended: true}
	}
	// Only the first look may count the lock as granted at once (see
	// restQueue).
	defer func() { l.q.fresh = false }()
	if l.q.mirrored {
		if v, ok := l.lookInMirror(); ok {
			return v
		}
	}
	v := view{
		d:        l.q.know.decide(),
		unread:   l.q.know.base == 0,
		ownStale: l.ownStale(),
		near:     l.w.shared != nil || (l.q.know.complete && (len(l.q.know.ahead)+l.q.sharing <= nearAhead || l.onlyReadersAhead())),
		current:  l.q.epoch%2 == 1 && l.q.epoch == l.w.queue.epoch.Load(),
		pred:     l.nearestAhead(),
	}
	// Once far back, a waiter keeps following single keys until granted:
	// as the queue drains it is second in line, and switching to the
	// queue watch there would cost a read on the path of the handoff.
	if l.w.shared == nil && (l.q.far || !v.near) {
		l.q.far = true
		v.far, v.followed, v.refollow = true, l.followingLocked(), len(l.q.know.ahead) < l.q.listed
	}
	l.decided(&v)
	return v
}

// decided acts on the rule's decision as look returns it: a grant is
// recorded, a lost key ends the lock. l.mu is held.
func (l *Lock) decided(v *view) {
	switch v.d.kind {
	case decideGranted:
		l.q.atOnce = l.q.fresh
		l.grant()
	case decideLost:
		l.keyGoneLocked()
		v.ended = true
	}
}

// ownWatchDelay is how long a lock granted with its own-key watch not up
// is held before that watch is opened (see look): until then the lock's
// key's deletion by someone else is reported late, by up to this much. The
// fence, not this report, is what keeps a late writer out.
const ownWatchDelay = 50 * time.Millisecond

// ownStale tells whether the lock's view cannot be relied on because the
// own-key watch was not up all along since it was read; a fresh view can
// while the watch has not come up since (see look). l.mu is held.
func (l *Lock) ownStale() bool {
	cur := l.w.own.epoch.Load()
	if cur%2 == 1 {
		return cur != l.q.ownEpoch
	}
	// The watch is not up. If it came up and went down since the view was
	// read, the deletions it delivered meanwhile have been applied, and
	// the recheck of its next coming up sees the lock as held.
	return !l.q.fresh
}

// restQueue tells the name's queue watch whether the lock was granted
// with nobody else queued, so that the watch rests while the name is
// uncontended (keyWatch.granted). A Keeper's watch serves its other
// sessions too: only its copy can tell that none of them is queued
// behind.
func (l *Lock) restQueue() {
	l.mu.Lock()
	alone := l.q.atOnce && (l.w.shared == nil || l.q.onlyKey)
	l.mu.Unlock()
	l.w.queue.granted(alone)
}

// restOwn, as Unlock is about to delete the key, tells the own-key watch
// whether the lock was granted at once and held for less than
// ownWatchDelay (as a lock granted with the watch down would never have
// opened it), so that the watch rests while the name is uncontended and
// held briefly; it reports whether the watch was paused now, before the
// delete, which it then does not hear. A lock held longer opens the
// watch again anyway, so pausing it for such locks would only add the
// watch's closing and opening to each.
func (l *Lock) restOwn() bool {
	l.mu.Lock()
	brief := l.q.atOnce && time.Since(l.hold.grantedAt) < ownWatchDelay
	l.mu.Unlock()
	return l.w.own.granted(brief)
}

// grant records that nothing is left ahead of the lock. If its own-key
// watch is not up, it is opened after ownWatchDelay. l.mu is held.
func (l *Lock) grant() {
	l.hold.granted = true
	if l.w.own.epoch.Load()%2 == 0 && l.hold.watchOwn == nil {
		l.hold.watchOwn = time.AfterFunc(ownWatchDelay, l.w.own.resume)
	}
}

// lookInMirror is look for a lock waiting on its Keeper's copy of the
// queue: the copy, which holds every key under the name as of its
// revision, is a snapshot for the rule whenever it shows the lock not
// blocked (or its own key not its own). ok is false if there is no copy
// of the lock's epoch any more: the lock then reads its view. Once held,
// the lock leaves the copy's waiters. l.mu is held.
func (l *Lock) lookInMirror() (v view, ok bool) {
	mv := l.w.queue.mirror.blocked(l.q.epoch, l)
	if !mv.ok {
		return view{}, false
	}
	if !mv.blocked || !l.owns(mv.own) {
		l.q.know.snapshot(mv.rev, mv.own, nil, true)
	}
	v = view{d: l.q.know.decide(), ownStale: l.ownStale(), near: true, current: true, mirrored: true, pred: mv.pred}
	if v.d.kind == decideRead && mv.blocked {
		// The copy wakes the lock when a deletion may grant it.
		v.d = decision{kind: decideWait}
	}
	l.decided(&v)
	if v.held() {
		l.q.onlyKey = l.w.queue.mirror.only(l)
		l.w.queue.mirror.leave(l, l.token)
	}
	return v, true
}

// wait blocks until the rule grants the lock. Near the head of the queue
// it follows the queue watch's deletions, and the last one ahead grants
// the lock with no read; further back it follows the two newest keys ahead
// (follow), reads its view again when one goes (rereadFar), and when the
// last one goes reads its own key, unless a watch has shown it lasting
// that long. With try set it looks once and returns ErrLocked if a key is
// ahead. If ctx ends, the error names the key it was waiting behind.
func (l *Lock) wait(ctx context.Context, try bool) error {
	retry := newBackoff(10*time.Millisecond, time.Second)
	for {
		v := l.look()
		if v.far {
			// The view follows single keys ahead: the queue watch would
			// only send this session every deletion in the queue.
			l.w.queue.pause()
		}
		var err error
		switch {
		case v.held():
			return nil
		case v.ended:
			return context.Cause(l.ctx)
		case try && !v.unread && v.pred != nil:
			// Someone holds it: whether the lock's own key is still there
			// changes nothing about that.
			return lockedBy(v.pred)
		case v.d.kind == decideWait && !v.ownStale && !(v.far && !v.followed):
			// A watch will deliver what the rule lacks, and wake the
			// lock. A waiter keeps its own-key watch up even where the
			// rule needs it not (the queue watch or the Keeper's copy
			// covers the own key): the copy wakes only the waiters a
			// deletion may grant, and neither carries a put by someone
			// else that moves the key off the lease.
			select {
			case <-l.changed:
			case <-ctx.Done():
				err = ctx.Err()
			}
		default:
			err = l.read(ctx, v)
		}
		if err := retried(ctx, &retry, err); err != nil {
			return behind(v.pred, err)
		}
	}
}

// retried returns nil once a step of wait that failed for a moment may
// run again (after a backoff), and err if it must not: etcd could not be
// reached for a moment, and the waiter's key stays queued; the session's
// deadline bounds how long this goes on.
func retried(ctx context.Context, retry *backoff, err error) error {
	if err == nil {
		retry.reset()
		return nil
	}
	if ctx.Err() != nil || !rpcerr.Transient(ctx, err) {
		return err
	}
	return retry.wait(ctx)
}

// read reads what the rule lacks, the way the lock's place in the queue
// calls for: its own key alone, its view of the queue, or the keys it
// follows far back.
func (l *Lock) read(ctx context.Context, v view) error {
	switch {
	case v.d.kind == decideReadOwn:
		// The last deletion ahead came from a watch that does not cover
		// the own key: a waiter whose key went before it must never be
		// told it holds the lock.
		return l.readOwn(ctx, v.d.rev)
	case v.ownStale && !v.unread:
		return l.confirmOwn(ctx)
	case v.unread || v.pred == nil:
		// Unread, or the page read held no queue key but older keys lie
		// past it: read again.
		return l.reread(ctx, v.d.rev)
	case v.far && v.refollow:
		return l.rereadFar(ctx)
	case v.far:
		return l.follow(ctx)
	case !v.current:
		l.w.queue.resume()
		return l.rereadNear(ctx)
	}
	return l.reread(ctx, v.d.rev)
}

// confirmOwn opens the own-key watch of a lock that has to wait, and reads
// its key once the watch is up: a deletion before then went unseen. The
// rest of the view stays as it is.
func (l *Lock) confirmOwn(ctx context.Context) error {
	ownEpoch, err := l.w.own.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	if err := l.readOwn(ctx, l.w.own.upRev.Load()); err != nil {
		return err
	}
	l.mu.Lock()
	l.q.ownEpoch = ownEpoch
	l.mu.Unlock()
	return nil
}

// readOwn reads the lock's own key in a state no older than minRev (nor
// than the token) and hands the answer to the rule; ErrKeyDeleted if the
// key is no longer this holding's.
func (l *Lock) readOwn(ctx context.Context, minRev int64) error {
	kv, rev, err := l.readOwnKey(ctx, minRev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.q.know.ownRead(rev, kv)
	l.mu.Unlock()
	if !l.owns(kv) {
		return ErrKeyDeleted
	}
	return nil
}

// onlyReadersAhead tells whether every key ahead is a reader's: they hold
// the lock together and leave in any order, so a writer behind them follows
// every deletion (waiting for the one just ahead would read again after
// each reader that leaves before it). l.mu is held.
func (l *Lock) onlyReadersAhead() bool {
	for _, a := range l.q.know.ahead {
		if modeOf(a.kv) != Read {
			return false
		}
	}
	return true
}

// nearestAhead is the newest key ahead, the one a waiter names. l.mu is
// held.
func (l *Lock) nearestAhead() *mvccpb.KeyValue {
	if kvs := l.q.know.keysAhead(); len(kvs) > 0 {
		return &mvccpb.KeyValue{Key: kvs[0].Key, CreateRevision: kvs[0].CreateRevision}
	}
	return nil
}

// behind says which key a waiter was waiting behind when err ended it.
func behind(pred *mvccpb.KeyValue, err error) error {
	if pred == nil {
		return err
	}
	return fmt.Errorf("waiting behind %s (token %d): %w", pred.Key, pred.CreateRevision, err)
}

// readAtLeast runs the read-only ops built by ops, serializable (answered
// by the member the client talks to, without a quorum round), and again
// linearizably if that member had not yet applied store revision minRev.
// Either way the answer is the state at one revision no lower than minRev.
func readAtLeast(ctx context.Context, cli *clientv3.Client, minRev int64, ops func(...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := cli.Txn(ctx).Then(ops(clientv3.WithSerializable())...).Commit()
	if err != nil || resp.Header.Revision >= minRev {
		return resp, err
	}
	return cli.Txn(ctx).Then(ops()...).Commit()
}

// reread reads the lock's view of the queue again, in a state no older
// than minRev, once the own-key watch is up: its own key, which must still
// be this holding (a waiter whose key vanished must never be told it holds
// the lock), and the keys just older than it. Deletions the watches
// deliver during the read are held back and applied after it.
func (l *Lock) reread(ctx context.Context, minRev int64) error {
	ownEpoch, err := l.w.own.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	return l.readView(ctx, ownEpoch, l.w.queue.epoch.Load(), minRev)
}

// rereadNear reads the view again once the queue watch is up too, so that
// the watch keeps it current from then on.
func (l *Lock) rereadNear(ctx context.Context) error {
	epoch, err := l.w.queue.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	ownEpoch, err := l.w.own.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	return l.readView(ctx, ownEpoch, epoch, 0)
}

// readView reads the view, recording the watch epochs it was read under.
// Keys that do not block the lock (nested locks' keys; readers', for a
// reader) are skipped, reading on, older, past a page full of them.
func (l *Lock) readView(ctx context.Context, ownEpoch, epoch uint64, minRev int64) error {
	l.leaveMirror()
	pfx := l.name + "/"
	maxRev := l.token - 1
	for {
		page, rev, err := l.readWithOwn(ctx, ownEpoch, epoch, minRev, func(opts ...clientv3.OpOption) clientv3.Op {
			return newestFirst(pfx, maxRev, l.page(), opts...)
		})
		if err != nil {
			return err
		}
		if len(page.Kvs) > 0 && page.Kvs[len(page.Kvs)-1].CreateRevision <= 1 {
			page.More = false // nothing is older than revision 1
		}
		l.setAhead(rev, page)
		if len(page.Kvs) == 0 || !page.More {
			return nil
		}
		l.mu.Lock()
		noneBlocks := len(l.q.know.ahead) == 0
		l.mu.Unlock()
		if !noneBlocks {
			return nil
		}
		maxRev = page.Kvs[len(page.Kvs)-1].CreateRevision - 1
	}
}

// readWithOwn reads the lock's own key and the range rng builds together,
// in a state no older than minRev and the token, with the view marked as
// being read under the given watch epochs (deletions delivered meanwhile
// are held back until it is set). It returns the range and the store
// revision read at, or ErrKeyDeleted if the key is no longer this
// holding's: a waiter whose key vanished must never be told it holds the
// lock.
func (l *Lock) readWithOwn(ctx context.Context, ownEpoch, epoch uint64, minRev int64, rng func(...clientv3.OpOption) clientv3.Op) (*pb.RangeResponse, int64, error) {
	follows := l.w.follows.subscribe(l)
	l.mu.Lock()
	l.q.ownEpoch, l.q.epoch, l.q.followEpochs = ownEpoch, epoch, follows
	// No older than what the rule relies on having seen (readFloor), nor
	// than what the own-key and queue watches handed on before this
	// point: the view took none of a queue watch's events of another
	// epoch, and a read older than them would show keys whose deletion no
	// watch will send again (the rule knows they went; the view, which
	// chooses how to wait, would wait for them).
	minRev = max(minRev, l.q.know.readFloor(), l.w.own.seenRev.Load())
	if epoch%2 == 1 {
		minRev = max(minRev, l.w.queue.seenRev.Load())
	}
	l.mu.Unlock()
	resp, err := readAtLeast(ctx, l.s.client, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(l.key, opts...), rng(opts...)}
	})
	if err != nil {
		return nil, 0, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; !l.ownsFirst(kvs) {
		l.mu.Lock()
		l.q.know.ownRead(resp.Header.Revision, firstKV(kvs))
		l.mu.Unlock()
		return nil, 0, ErrKeyDeleted
	}
	return resp.Responses[1].GetResponseRange(), resp.Header.Revision, nil
}

// recheck reads the key of a held lock again after its watch was down, in
// which time a deletion may have gone unseen.
func (l *Lock) recheck(ctx context.Context) error {
	l.mu.Lock()
	held := l.hold.granted
	l.mu.Unlock()
	if !held {
		return nil // a waiter reads its view again itself
	}
	rctx, cancel := context.WithTimeout(ctx, l.s.ttl)
	defer cancel()
	kv, _, err := l.readOwnKey(rctx, l.w.own.upRev.Load())
	if err != nil {
		return err
	}
	if !l.owns(kv) {
		l.mu.Lock()
		l.keyGoneLocked()
		l.mu.Unlock()
	}
	return nil
}

// readOwnKey reads the lock's key (nil if absent) in a state no older
// than minRev nor the token, and returns the revision read at. A recheck
// passes the revision its own-key watch came up at: with the watch's
// events after it, no change of the key goes unseen. The member the
// client talks to answers it once it has applied that revision
// (readAtLeast): a linearizable read waits out a member cut from the
// quorum, and under network partitions it kept successors from the lock
// (internal/chaos/results/net-partition-confirm-own.txt).
func (l *Lock) readOwnKey(ctx context.Context, minRev int64) (*mvccpb.KeyValue, int64, error) {
	resp, err := readAtLeast(ctx, l.s.client, max(minRev, l.token), func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(l.key, opts...)}
	})
	if err != nil {
		return nil, 0, err
	}
	return firstKV(resp.Responses[0].GetResponseRange().Kvs), resp.Header.Revision, nil
}

// ownsFirst is owns for the result of a read of the lock's key.
func (l *Lock) ownsFirst(kvs []*mvccpb.KeyValue) bool { return l.owns(firstKV(kvs)) }

// leave hands the name's local gate on, once.
func (l *Lock) leave() {
	l.mu.Lock()
	release := l.hold.gate
	l.hold.gate = nil
	l.mu.Unlock()
	if release != nil {
		release()
	}
}

// abandon gives up a lock that was never handed to the caller: its key is
// removed if it still carries the token, and the lock is ended. With a
// lock delay, a delay record that says this holding held the name (its
// write may have gone through with its answer lost) is turned into a
// release in the same step, so the next holder sees no loss.
func (l *Lock) abandon() {
	l.cleanup(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token), l.abandonOps()...)
	l.end(ErrUnlocked)
}

// cleanup deletes the lock key, with ops, if cmp holds, trying again until
// it is done or the session ends, not bounded by the caller's ctx (which
// may be what failed): a key left while the session lives would hold up
// every later waiter. A session that cannot reach etcd ends within its
// TTL, and its lease takes the key with it.
func (l *Lock) cleanup(cmp clientv3.Cmp, ops ...clientv3.Op) {
	retry := newBackoff(20*time.Millisecond, time.Second)
	then := append([]clientv3.Op{clientv3.OpDelete(l.key)}, ops...)
	for {
		_, err := l.s.client.Txn(l.s.ctx).If(cmp).Then(then...).Commit()
		if err == nil {
			return
		}
		if rpcerr.Definite(err) {
			// Refused outright (no permission to delete, say): sending it
			// again changes nothing, and the lease removes the key.
			l.s.lg.Error("lock key left for the lease to remove", zap.String("key", l.key), zap.Error(err))
			return
		}
		if retry.wait(l.s.ctx) != nil {
			l.s.lg.Debug("lock key left for the ended session's lease to remove", zap.String("key", l.key), zap.Error(err))
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
	rested := l.restOwn()
	resp, err := l.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)).
		Then(append([]clientv3.Op{clientv3.OpDelete(l.key)}, l.releaseOps()...)...).
		Commit()

	l.mu.Lock()
	released := (err == nil && resp.Succeeded) || (err != nil && l.hold.phase == releasedOrTaken)
	finishHere := false
	if released {
		// Before the phase goes back: the own-key watch may see our own delete
		// at any moment after, and must not call it a loss.
		finishHere = l.cancelWith(ErrUnlocked)
	}
	l.hold.phase = steady
	l.mu.Unlock()
	switch {
	case released:
		l.finishOrWait(finishHere)
		return nil
	case err == nil:
		l.end(ErrKeyDeleted)
		return ErrKeyDeleted
	default:
		if rested {
			// Still held, perhaps: its key's deletion must be heard.
			l.w.own.resume()
		}
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
	l.hold.value = value
	l.mu.Unlock()
	return nil
}

// currentValue is the value the key was last given.
func (l *Lock) currentValue() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold.value
}

func (l *Lock) setPhase(p phase) {
	l.mu.Lock()
	l.hold.phase = p
	l.mu.Unlock()
}

// end ends the lock with cause and waits for it to finish.
func (l *Lock) end(cause error) {
	l.finishOrWait(l.cancelWith(cause))
}

// cancelWith ends the lock's context with cause. It reports whether
// finish is left to the caller (finishOrWait): it is, unless the context
// had ended already and finish has started on a goroutine of its own;
// running it on the caller's goroutine spares a goroutine and a wake-up on
// every release.
func (l *Lock) cancelWith(cause error) (finishHere bool) {
	finishHere = l.stopFinish()
	l.cancel(cause)
	return finishHere
}

// finishOrWait runs finish if cancelWith left it to the caller, and waits
// for it to be done otherwise.
func (l *Lock) finishOrWait(finishHere bool) {
	if finishHere {
		l.finish()
		return
	}
	<-l.finished
}
