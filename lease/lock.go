package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// Lock is one holding of a named lock by a Session. Its methods are safe for
// concurrent use.
//
// A Lock is held from the moment it is returned until Done is closed.
// Ownership can end at any time without the holder's help (the lease
// expires, someone deletes the key), and a paused process may not notice,
// so an open Done never proves ownership at the moment of a write. Pass
// Token to the resource and let it reject stale tokens (package fence).
type Lock struct {
	s     *Session
	name  string
	key   string
	token int64
	mode  Mode

	// ctx ends, with the reason as its cause, when ownership ends (Err,
	// Context); finished (Done) is closed once finish has run after that.
	ctx      context.Context
	cancel   context.CancelCauseFunc
	finished chan struct{}
	// stopFinish keeps finish off a goroutine of its own, if not too late.
	stopFinish func() bool

	trace *CallHooks // the acquiring call's tracing hooks; nil for none

	w       watches       // the name's watches, which deliver deletions
	changed chan struct{} // poked when the keys ahead may have changed

	writing sync.Mutex // one write of the key at a time: Unlock, Resign, Proclaim
	kw      keyWrites  // the key's writes that need its marker

	mu   sync.Mutex // guards hold and q
	hold keyState
	q    waiting
}

// keyState is the lock's key and its holding. Lock.mu guards it.
type keyState struct {
	phase phase
	gate  func() // gives the name's local gate back; nil once given back
	value string // the key's value: empty for a lock, the leader's for a campaign
	// grantedAt and finishedEnd: whichever is set second reports the end.
	grantedAt   time.Time
	finishedEnd bool
	granted     bool // the rule granted the lock: it is (or was) held
	// watchOwn opens the own-key watch after ownWatchDelay (grant).
	watchOwn *time.Timer
}

// waiting is how a lock waits for its turn: its queue.Waiter, which
// decides every step. Lock.mu guards it.
type waiting struct {
	queue.Waiter
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

// Key is the etcd key that holds the lock: Name()/lease ID in hex.
func (l *Lock) Key() string { return l.key }

// Token is the fencing token: the creation revision of the lock key. Every
// later holder of the same name has a strictly larger token, across etcd
// leader changes. Tokens of different names are unrelated.
func (l *Lock) Token() int64 { return l.token }

// Done is closed when ownership ends, for whatever reason (Unlock,
// Session.Close, lease expiry, deletion or replacement of the key), once
// the end has been logged and reported to the session's Hooks. A lock
// granted at once sees a deletion of its key in its first 50 ms only at
// their end (see the package doc).
func (l *Lock) Done() <-chan struct{} { return l.finished }

// Err is nil while the lock is held. After Done is closed it says why:
// ErrUnlocked, ErrSessionClosed, or for an involuntary loss an error
// wrapping ErrLost (ErrLeaseExpired, ErrKeyDeleted, ErrRevisionRegressed).
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Context returns a context derived from parent, also cancelled when
// ownership ends, with the lock's Err as its cause (context.Cause), for
// work done under the lock. Call cancel when the work is done.
func (l *Lock) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return linkCause(parent, l.ctx)
}

// WriteContext returns a context for a fenced write made under the lock.
// It keeps parent's values and ends neither with parent nor with the lock,
// but after the session's TTL: a write under way as the lock is lost must
// still reach the resource, whose fence decides whether it counts, and no
// write outlives the lease by much. Call cancel when the write is done.
func (l *Lock) WriteContext(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), l.s.ttl)
}

// Lock takes the lock name, waiting until it is held or ctx ends. Locks of
// the same name taken through the same session exclude each other.
//
// A failed Lock removes its key before it returns, even if ctx has ended,
// so it may return after ctx's end: at the latest when the session ends
// (within its TTL if etcd is unreachable). If etcd refuses the delete
// outright, the key stays until the lease ends. A
// waiter whose own key or session vanishes returns at once, with an error
// wrapping ErrLost or ErrSessionClosed. A waiter whose ctx ends gets an
// error that matches ctx's error (context.DeadlineExceeded or
// context.Canceled) and names the key it was waiting behind, if any.
func (s *Session) Lock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "Lock", Name: name, Mode: Write}, "", false)
}

// TryLock takes the lock name if nobody holds it, and returns an error
// wrapping ErrLocked at once otherwise, naming a key ahead of it and its
// token (or saying that this same session holds or awaits it). A failed
// TryLock leaves no key behind. It writes nothing at all while the name
// has no keys under it but its queue's; with many other keys there (data,
// nested locks' keys) it may put its key and remove it again.
func (s *Session) TryLock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "TryLock", Name: name, Mode: Write}, "", true)
}

// acquire is the common path of Lock, TryLock, RLock, TryRLock, Campaign:
// it traces the call and names it in its error.
func (s *Session) acquire(ctx context.Context, c Call, value string, try bool) (*Lock, error) {
	ctx, trace := s.hooks.call(ctx, c)
	l, err := s.take(ctx, c.Name, c.Mode, value, try, trace)
	if err != nil {
		err = failed(fmt.Sprintf("%s %q", strings.ToLower(c.Op), c.Name), err)
		trace.done(0, err)
		return nil, err
	}
	trace.done(l.token, nil)
	return l, nil
}

// take queues the lock and waits for its turn.
func (s *Session) take(ctx context.Context, name string, mode Mode, value string, try bool, trace *CallHooks) (*Lock, error) {
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
	l := &Lock{s: s, name: name, key: lockKey(name, s.id), mode: mode, w: w, trace: trace}
	l.kw = s.keyWrites(name, l.key)
	l.hold.value, l.hold.gate = value, release
	pfx := name + "/"
	l.q.Waiter = queue.NewWaiter(queue.NewRule(l.key, l.owns, l.blocksKV), queue.Config{
		Shared: w.shared != nil, Near: nearAhead, Follow: followKeys,
		IsReader:   func(kv *mvccpb.KeyValue) bool { return modeOf(kv) == Read },
		IsQueueKey: func(kv *mvccpb.KeyValue) bool { return isQueueKey(pfx, kv) },
		IsChild:    func(kv *mvccpb.KeyValue) bool { return isChildKey(pfx, kv) },
	})
	if err := l.start(); err != nil {
		return nil, err
	}
	if err := l.queue(ctx, try); err != nil {
		l.end(ErrUnlocked) // its key was withdrawn or removed: see create
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

// start gives the lock its context (Close waits for it to finish) and its
// watches. It does not wait for the own-key watch: a lock granted at once
// needs it only after ownWatchDelay, and a waiter opens it before it
// relies on its view.
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
	l.q.Read(ownEpoch, epoch, follows, 0)
	l.mu.Unlock()
	return nil
}

// finish stops the ended lock's events, hands on the gate, reports the end.
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

// queue puts the key with requests that end with the session too: a
// waiter whose lease is gone must not sit in a request until ctx ends.
func (l *Lock) queue(ctx context.Context, try bool) error {
	cctx, stop := l.s.bound(ctx)
	err := l.create(cctx, try)
	stop()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// etcd knows the lease is gone before the keep-alives told the
		// session: end it, so that this call and every later one say so.
		l.s.lose("etcd refused a put on the lease: lease not found")
	}
	if err != nil && l.s.ctx.Err() != nil {
		err = context.Cause(l.s.ctx)
	}
	return err
}

// await waits for the lock's turn; with try set it only checks that no
// key is ahead (tryEmpty may have seen only keys that do not block).
func (l *Lock) await(ctx context.Context, try bool) error {
	st, ended := l.look(try)
	l.reportQueued()
	switch {
	case ended:
		return context.Cause(l.ctx)
	case st.Kind == queue.StepHeld:
		return nil
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

// page is how many keys ahead the lock's reads return.
func (l *Lock) page() int64 {
	if l.w.shared != nil {
		return sharedPage
	}
	return queuePage
}

// create puts the lock key and reads the keys just ahead of it; with try
// set it first puts the key only if no key exists under the name.
func (l *Lock) create(ctx context.Context, try bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Writes go out under the session, not ctx: a put cut off by ctx may
	// be applied after the cleanup, leaving a key at the queue's head. So
	// await etcd's answer (or the session's end), then remove the key if
	// ctx has ended. They keep ctx's values (a trace's span, say).
	wctx, stop := linkCause(context.WithoutCancel(ctx), l.s.ctx)
	err := l.enqueue(ctx, wctx, try)
	stop()
	if err == nil && l.token != 0 && ctx.Err() != nil {
		l.cleanup()
		return ctx.Err()
	}
	return err
}

// enqueue is create's work: its writes use wctx, its waits ctx.
func (l *Lock) enqueue(ctx, wctx context.Context, try bool) error {
	if try {
		if done, err := l.tryEmpty(wctx); done || err != nil {
			return err
		}
		// Only keys that do not block were seen: queue, then look again.
	}
	// A paused Keeper's watch (keyWatch.granted) keeps no copy: read.
	mirrored := !try && l.w.queue.mirror != nil && !l.w.queue.isPaused()
	var reads []clientv3.Op
	if !mirrored {
		reads = append(reads, newestFirst(l.name+"/", 0, l.page()+1))
	}
	for tries := 0; ; tries++ {
		resp, err := l.kw.put(wctx, l.hold.value, reads...)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			l.setToken(resp.Header.Revision)
			l.s.probeKey.Store(l.key)
			l.s.sawRevision(resp.Header.Revision)
			l.queued(ctx, resp, mirrored)
			return nil
		}
		if err := l.notPut(wctx, resp, tries); err != nil {
			return err
		}
	}
}

// notPut sees to what kept enqueue's put from applying, so that it may
// try again (keyWrites.notPut): it removes a key at the lock's own path
// that someone else's put moved off the session's lease, which is no lock.
func (l *Lock) notPut(wctx context.Context, resp *clientv3.TxnResponse, tries int) error {
	key, marker := readsOf(resp.Responses)
	again, other, err := l.kw.notPut(wctx, key, marker)
	switch {
	case err != nil:
		return err
	case tries >= putTries:
		return fmt.Errorf("%w: %s: the put kept failing", ErrKeyInUse, l.key)
	case again:
		return nil
	}
	return l.s.removeLeftover(wctx, other)
}

// queued takes the view from the put's answer or from the Keeper's copy.
func (l *Lock) queued(ctx context.Context, resp *clientv3.TxnResponse, mirrored bool) {
	if mirrored {
		l.viewFromMirror(ctx)
		return
	}
	// The page (after the puts of the key and its marker) holds the new
	// key itself, the newest under the name.
	l.setAhead(resp.Header.Revision, resp.Responses[2].GetResponseRange())
}

// tryEmpty puts the key only if no key is under the name. done: it was
// put (held), a blocking key was found (err wraps ErrLocked), or it
// failed; otherwise only keys that do not block were found: queue.
func (l *Lock) tryEmpty(wctx context.Context) (done bool, err error) {
	resp, err := l.kw.tryPut(wctx, l.hold.value, oldestFirst(l.name+"/"))
	if err != nil {
		return true, err
	}
	if resp.Succeeded {
		l.setToken(resp.Header.Revision)
		l.setAhead(resp.Header.Revision, nil)
		return true, nil
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		// A key at the own path is no other holder: enqueue sees to it.
		if string(kv.Key) != l.key && l.blocksKV(kv) {
			return true, lockedBy(kv)
		}
	}
	return false, nil
}

// setToken records the token and marks the view about to be set fresh.
// Under l.mu: watch deliveries and finish read it on other goroutines.
func (l *Lock) setToken(token int64) {
	l.mu.Lock()
	l.token = token
	l.q.SetToken(token)
	l.mu.Unlock()
}

// viewFromMirror makes the lock wait on its Keeper's copy of the queue
// once the copy has applied the lock's put, in the lock's watch epoch. The
// copy wakes only the waiters a deletion may grant, so the lock hears the
// queue watch's events through the copy alone (joinCopy).
func (l *Lock) viewFromMirror(ctx context.Context) {
	l.mu.Lock()
	epoch := l.q.Epoch()
	l.mu.Unlock()
	if !l.w.queue.mirror.join(ctx, l.ctx.Done(), epoch, l) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.joinCopy(epoch) {
		l.leaveCopyLocked()
	}
}

// joinCopy moves the lock's queue subscription onto the copy
// (queue.Waiter.JoinCopy), up in epoch only, covering what the copy
// holds. It reports false if the watch has left epoch meanwhile or the
// copy is gone. l.mu is held.
func (l *Lock) joinCopy(epoch queue.Epoch) bool {
	w := l.w.queue
	return l.q.JoinCopy(feed{l, w}, epoch, func() (int64, bool) {
		mv := w.mirror.snapshot(epoch, l)
		return mv.Base, mv.OK
	})
}

// leaveCopy puts a lock that waited on the copy back on the queue watch's
// events, as it reads its view: the copy is gone or the own-key watch
// restarted. What it missed meanwhile, the new subscription does not
// cover: the rule reads.
func (l *Lock) leaveCopy() {
	l.mu.Lock()
	l.leaveCopyLocked()
	l.mu.Unlock()
}

// leaveCopyLocked is leaveCopy with l.mu held.
func (l *Lock) leaveCopyLocked() {
	if l.q.LeaveCopy(feed{l, l.w.queue}) {
		l.w.queue.mirror.leave(l, l.token)
	}
}

// oldestFirst reads the first page of keys under pfx, oldest first. Not
// keys-only: isQueueKey needs leases, empty in etcd 3.7 keys-only reads.
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

// setAhead makes page, read at rev with the own key, the rule's snapshot
// of the older keys that block (queue.Waiter.Page); nil: no key is there.
func (l *Lock) setAhead(rev int64, page *pb.RangeResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.Page(rev, l.ownKV(), page.GetKvs(), page.GetMore())
}

// events feeds one watch response's events, in revision order and epoch,
// to the rule, and wakes the waiter. A change of the own key after the
// token that takes it from this holding ends the lock, waiting or held.
func (l *Lock) events(w *keyWatch, src queue.Source, events []*clientv3.Event, epoch queue.Epoch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.feed(src, events, epoch)
	l.lostLocked()
	l.wake()
}

// lostLocked ends the lock, waiting or held, once the rule has learnt
// that its key was deleted, made another holding's or moved off the
// session's lease after the token: the one place a lock ends for a fact
// about its key. It reports whether it did. l.mu is held.
func (l *Lock) lostLocked() bool {
	if l.token == 0 || !l.q.Rule.Lost() {
		return false // the rule keeps the own key's events until the token is known
	}
	l.keyGoneLocked()
	return true
}

// wake is poke for news of the queue: a watch's events, or the copy's
// word that a deletion may grant the lock (a fault-suite mutant drops it).
func (l *Lock) wake() {
	if !l.dropsWake() {
		l.poke()
	}
}

// poke wakes the waiter, if any, to look at the lock's view again.
func (l *Lock) poke() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// keyGoneLocked records that the key was deleted. With an Unlock in
// flight, its outcome decides how the lock ended. l.mu is held.
func (l *Lock) keyGoneLocked() {
	if l.hold.phase != steady {
		l.hold.phase = releasedOrTaken
		return
	}
	l.cancel(ErrKeyDeleted) // reported, with every other end, by reportEnd
}

// look asks the lock's waiter for its next step (queue.Waiter.Next),
// and records a grant or ends a lost lock. Once granted it stays held for
// recheck: no older key can appear, and the own-key watch reports the
// key's end. A lock granted with that watch down opens it only after
// ownWatchDelay (grant), sparing a short holding the event of its own
// Unlock, an uncontended lock's largest cost after its requests. ended:
// the lock has ended (see its context's cause), and is never held.
func (l *Lock) look(try bool) (st queue.Step, ended bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		// Ended while waiting: never granted, whatever the view says.
		return queue.Step{}, true
	}
	mirrored := l.q.Mirrored() && l.lookInMirror()
	st = l.q.Next(queue.Now{Own: l.w.own.epochNow(), Queue: l.w.queue.epochNow(), Follow: l.w.follows.epochOf}, try, mirrored)
	switch st.Kind {
	case queue.StepHeld:
		l.grant()
		if mirrored {
			l.q.Copied(l.w.queue.mirror.only(l))
			l.w.queue.mirror.leave(l, l.token)
		}
	case queue.StepLost:
		l.lostLocked()
		return st, true
	}
	return st, false
}

// restQueue tells the queue watch whether the lock was granted with
// nobody else queued, so it rests while the name is uncontended. A
// Keeper's watch serves other sessions, whose waiters only its copy sees.
func (l *Lock) restQueue() {
	l.mu.Lock()
	alone := l.q.Alone()
	l.mu.Unlock()
	l.w.queue.granted(alone)
}

// restOwn, as Unlock is about to delete the key, tells the own-key watch
// whether the lock was granted at once and held under ownWatchDelay, and
// reports whether the watch paused now, missing the delete. A lock held
// longer reopens the watch anyway: pausing would add a close and an open.
func (l *Lock) restOwn() bool {
	l.mu.Lock()
	brief := l.q.AtOnce() && time.Since(l.hold.grantedAt) < ownWatchDelay
	l.mu.Unlock()
	return l.w.own.granted(brief)
}

// grant records that nothing is left ahead of the lock. If its own-key
// watch is not up, it is opened after ownWatchDelay. l.mu is held.
func (l *Lock) grant() {
	l.hold.granted = true
	if !l.w.own.epochNow().Up() && l.hold.watchOwn == nil {
		l.hold.watchOwn = time.AfterFunc(ownWatchDelay, l.w.own.resume)
	}
}

// lookInMirror has the rule take the Keeper's copy, which holds every
// key under the name, as a read of the queue at its revision. It reports
// false once the copy of the lock's epoch is gone, and then puts the lock
// back on the queue watch's events. l.mu is held.
func (l *Lock) lookInMirror() bool {
	mv := l.w.queue.mirror.snapshot(l.q.Epoch(), l)
	if !mv.OK {
		l.leaveCopyLocked()
		return false
	}
	l.q.Rule.Snapshot(mv.Rev, mv.Own, mv.Older, mv.Complete)
	return true
}

// wait blocks until the rule grants the lock, carrying out each step its
// waiter decides: near the head it follows the queue watch's deletions;
// further back, the newest keys ahead (follow), reading again as one goes.
// With try set it returns ErrLocked once it sees a key ahead. If ctx ends,
// the error names the key it waited behind.
func (l *Lock) wait(ctx context.Context, try bool) error {
	retry := newBackoff(10*time.Millisecond, time.Second)
	for {
		st, ended := l.look(try)
		if ended {
			return context.Cause(l.ctx)
		}
		if st.PauseQueue {
			// Far: the queue watch would only send every deletion.
			l.w.queue.pause()
		}
		switch st.Kind {
		case queue.StepHeld:
			return nil
		case queue.StepLocked:
			return lockedBy(st.Pred)
		}
		if err := retried(ctx, &retry, l.do(ctx, st)); err != nil {
			return behind(st.Pred, err)
		}
	}
}

// do carries out a step of a waiter: wait for news, or read what the rule
// lacks.
func (l *Lock) do(ctx context.Context, st queue.Step) error {
	switch st.Kind {
	case queue.StepWait:
		select {
		case <-l.changed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case queue.StepReadOwn:
		return l.readOwn(ctx, st.MinRev)
	case queue.StepConfirmOwn:
		return l.confirmOwn(ctx)
	case queue.StepRereadFar:
		return l.rereadFar(ctx)
	case queue.StepFollow:
		return l.follow(ctx)
	case queue.StepReadNear:
		l.w.queue.resume()
		return l.rereadNear(ctx)
	}
	return l.reread(ctx, st.MinRev)
}

// retried returns nil once a failed step of wait may run again after a
// backoff: a transient etcd error leaves the key queued, and ctx ends with
// the session. Otherwise it returns err, or ctx's error.
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

// confirmOwn opens the own-key watch of a lock that has to wait, and reads
// its key once the watch is up: a deletion before then went unseen.
func (l *Lock) confirmOwn(ctx context.Context) error {
	ownEpoch, err := l.w.own.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	if err := l.readOwn(ctx, l.w.own.upRev.Load()); err != nil {
		return err
	}
	l.mu.Lock()
	l.q.ConfirmedOwn(ownEpoch)
	l.mu.Unlock()
	return nil
}

// readOwn reads the own key at minRev, the token or later, for the rule;
// ErrKeyDeleted if the key is no longer this holding's.
func (l *Lock) readOwn(ctx context.Context, minRev int64) error {
	kv, rev, err := l.readOwnKey(ctx, minRev)
	if err != nil {
		return err
	}
	return l.ownRead(rev, kv)
}

// ownRead feeds the rule a read of the own key at rev (kv nil if absent).
// If the rule then knows the key is no longer this holding's, the lock
// ends (lostLocked) and ownRead returns ErrKeyDeleted.
func (l *Lock) ownRead(rev int64, kv *mvccpb.KeyValue) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.Rule.OwnRead(rev, kv)
	if l.lostLocked() {
		return ErrKeyDeleted
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

// readAtLeast runs the ops serializably (the client's member answers, with
// no quorum round), and linearizably if that member had not applied
// minRev: either way the answer is one revision's state, at least minRev.
func readAtLeast(ctx context.Context, cli *clientv3.Client, minRev int64, ops func(...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := cli.Txn(ctx).Then(ops(clientv3.WithSerializable())...).Commit()
	if err != nil || resp.Header.Revision >= minRev {
		return resp, err
	}
	return cli.Txn(ctx).Then(ops()...).Commit()
}

// reread reads the view at minRev or later once the own-key watch is up;
// watch deliveries during the read are applied after it.
func (l *Lock) reread(ctx context.Context, minRev int64) error {
	ownEpoch, err := l.w.own.upEpoch(ctx, l)
	if err != nil {
		return err
	}
	return l.readView(ctx, ownEpoch, l.w.queue.epochNow(), minRev)
}

// rereadNear reads the view once the queue watch is up, to keep it current.
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

// readView reads the view under the given watch epochs, reading older
// pages past a page of keys that do not block the lock.
func (l *Lock) readView(ctx context.Context, ownEpoch, epoch queue.Epoch, minRev int64) error {
	l.leaveCopy()
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
		noneBlocks := l.q.Rule.AheadCount() == 0
		l.mu.Unlock()
		if !noneBlocks {
			return nil
		}
		maxRev = page.Kvs[len(page.Kvs)-1].CreateRevision - 1
	}
}

// readWithOwn reads the own key and rng's range at minRev, the token or
// later, under the given watch epochs (deliveries wait until the view is
// set). ErrKeyDeleted if the key is no longer this holding's: such a
// waiter must never be granted.
func (l *Lock) readWithOwn(ctx context.Context, ownEpoch, epoch queue.Epoch, minRev int64, rng func(...clientv3.OpOption) clientv3.Op) (*pb.RangeResponse, int64, error) {
	follows := l.w.follows.subscribe(l)
	// No older than the rule's read floor nor what the watches handed on:
	// an older read would show keys whose deletion no watch will send
	// again (the view took none of another epoch's events), and wait for
	// them.
	l.mu.Lock()
	seen := l.w.own.seenRev.Load()
	if epoch.Up() {
		seen = max(seen, l.w.queue.seenRev.Load())
	}
	minRev = max(minRev, l.q.Read(ownEpoch, epoch, follows, seen))
	l.mu.Unlock()
	resp, err := readAtLeast(ctx, l.s.client, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(l.key, opts...), rng(opts...)}
	})
	if err != nil {
		return nil, 0, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; !l.ownsFirst(kvs) {
		// The read is at the token or later (the rule's read floor), so
		// the rule takes it as the key's end.
		if err := l.ownRead(resp.Header.Revision, firstKV(kvs)); err != nil {
			return nil, 0, err
		}
	}
	return resp.Responses[1].GetResponseRange(), resp.Header.Revision, nil
}

// recheck reads a held lock's key again after its watch was down, when a
// deletion may have gone unseen.
func (l *Lock) recheck(ctx context.Context) error {
	l.mu.Lock()
	held := l.hold.granted
	l.mu.Unlock()
	if !held {
		return nil // a waiter reads its view again itself
	}
	rctx, cancel := context.WithTimeout(ctx, l.s.ttl)
	defer cancel()
	kv, rev, err := l.readOwnKey(rctx, l.w.own.upRev.Load())
	if err != nil {
		return err
	}
	// A key gone ends the lock (ownRead); that is no failure of the read.
	_ = l.ownRead(rev, kv)
	return nil
}

// readOwnKey reads the lock's key (nil if absent) at minRev, the token or
// later. A recheck passes its own-key watch's up revision, so no change
// goes unseen. readAtLeast lets the client's member answer: a linearizable
// read waits out a member cut off from the quorum.
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

// abandon removes the key of a lock never handed to the caller, if it
// still carries the token, and ends the lock. With a lock delay, a record
// that it held the name becomes a release, so the next holder sees no
// loss.
func (l *Lock) abandon() {
	l.cleanup(l.abandonOps()...)
	l.end(ErrUnlocked)
}

// cleanup deletes the key, with ops, if it still carries the token,
// retrying until done or the session ends, whatever the caller's ctx: a
// key left while the session lives holds up every later waiter; the
// session's end takes it.
func (l *Lock) cleanup(ops ...clientv3.Op) {
	retry := newBackoff(20*time.Millisecond, time.Second)
	then := l.removeOps(ops...)
	for {
		resp, err := l.s.keys.Txn(l.s.ctx).If(l.tokenCmp()).Then(then...).Commit()
		if err == nil {
			if resp.Succeeded {
				l.kw.released()
			}
			return
		}
		if rpcerr.Refused(err) {
			// Refused outright (no permission, say): retrying changes nothing.
			l.s.lg.Error("lock key left until this session's next lock of the name or its end",
				zap.String("key", l.key), zap.Error(err))
			return
		}
		if retry.wait(l.s.ctx) != nil {
			l.s.lg.Debug("lock key left for the ended session's lease to remove", zap.String("key", l.key), zap.Error(err))
			return
		}
	}
}

// removeOps delete the holding's key, and its marker unless it is kept
// (keyWrites.releaseOps), then do ops: cleanup's and Unlock's Then, under
// tokenCmp. Once they applied, keyWrites.released records it.
func (l *Lock) removeOps(ops ...clientv3.Op) []clientv3.Op {
	return append(append([]clientv3.Op{clientv3.OpDelete(l.key)}, l.kw.releaseOps()...), ops...)
}

// tokenCmp holds while the key is this holding's: a later holding of the
// session has a later creation revision.
func (l *Lock) tokenCmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)
}

// Unlock releases the lock: it deletes the key only if the key's creation
// revision is still the token, so it never removes a later holder's key,
// even when a retry arrives late. Done then closes and Err is ErrUnlocked.
//
// If the lock has already ended, Unlock sends nothing and returns an error
// saying how: wrapping ErrUnlocked, ErrSessionClosed or ErrLost. If the key
// was found gone or replaced, the error wraps ErrKeyDeleted. If Unlock
// returns etcd's error (no answer, or ctx ended), the lock is still
// considered held, and Unlock may be called again.
func (l *Lock) Unlock(ctx context.Context) error {
	ctx, done := l.traceRelease(ctx, "Unlock")
	err := l.unlock(ctx)
	if err != nil {
		err = failed(fmt.Sprintf("unlock %q", l.name), err)
	}
	done(err)
	return err
}

func (l *Lock) unlock(ctx context.Context) error {
	l.writing.Lock()
	defer l.writing.Unlock()
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	l.setPhase(releasing)
	rested := l.restOwn()
	resp, err := l.s.keys.Txn(ctx).
		If(l.tokenCmp()).
		Then(l.removeOps(l.releaseOps()...)...).
		Commit()
	if err == nil && resp.Succeeded {
		l.kw.released()
	}

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

// put sets the key's value, guarded by its creation revision and lease: it
// never creates a key, touches a successor's, or puts back on the lease a
// key someone moved off it (which ended the holding). A key found gone or
// moved ends the lock.
func (l *Lock) put(ctx context.Context, value string) error {
	l.writing.Lock()
	defer l.writing.Unlock()
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	resp, err := l.s.client.Txn(ctx).
		If(l.heldCmps()...).
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

// heldCmps are the comparisons that hold while the key is this holding's:
// its creation revision is the token and it is on the session's lease.
func (l *Lock) heldCmps() []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token),
		clientv3.Compare(clientv3.LeaseValue(l.key), "=", int64(l.s.id)),
	}
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

// cancelWith ends the lock's context and reports whether finish is left
// to the caller: it saves a goroutine and a wake-up on every release.
func (l *Lock) cancelWith(cause error) (finishHere bool) {
	finishHere = l.stopFinish()
	l.cancel(cause)
	return finishHere
}

// finishOrWait runs finish if left to the caller, or waits for it.
func (l *Lock) finishOrWait(finishHere bool) {
	if finishHere {
		l.finish()
		return
	}
	<-l.finished
}
