package lease

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

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
			l.q.Copied(l.w.queue.mirror.only(l.key, l.token))
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
	mv := l.w.queue.mirror.snapshot(l.q.Epoch(), l.key, l.token, l.mode == Read)
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
