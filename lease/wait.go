package lease

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/backoff"
	"github.com/leasefence/leasefence/lease/internal/keyread"
	"github.com/leasefence/leasefence/lease/internal/keywrite"
	"github.com/leasefence/leasefence/lease/internal/queue"
	"github.com/leasefence/leasefence/lease/internal/watch"
)

// Events feeds one watch response's events, in revision order and epoch,
// to the rule, and wakes the waiter (watch.Listener). A change of the own key after the
// token that takes it from this holding ends the lock, waiting or held.
func (t *tracker) Events(w *watch.Watch, src queue.Source, events []*mvccpb.Event, epoch queue.Epoch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.feed(src, events, epoch)
	t.lostLocked()
	t.wake()
}

// lostLocked ends the lock, waiting or held, once the rule has learnt
// that its key was deleted, made another holding's or moved off the
// session's lease after the token: the one place a lock ends for a fact
// about its key. It reports whether it did. t.mu is held.
func (t *tracker) lostLocked() bool {
	if t.token == 0 || !t.keyEndedLocked() {
		return false // the rule keeps the own key's events until the token is known
	}
	t.keyGoneLocked()
	return true
}

// keyEndedLocked tells whether the rule, or once the lock is held what
// its key's events and reads showed (queue.EndsHolding), has the key
// deleted or not this holding's after the token. t.mu is held.
func (t *tracker) keyEndedLocked() bool {
	if t.q == nil {
		return t.hold.keyEnded
	}
	return t.q.Rule.Lost()
}

// wake is poke for news of the queue: a watch's events, or the copy's
// word that a deletion may grant the lock (a fault-suite mutant drops it).
func (t *tracker) wake() {
	if !t.dropsWake() {
		t.poke()
	}
}

// poke wakes the waiter, if any, to look at the lock's view again. Before
// the lock's first wait there is no channel and nobody to wake: wait makes
// it before it looks.
func (t *tracker) poke() {
	if ch := t.changed.Load(); ch != nil {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
}

// keyGoneLocked records that the key was deleted. With an Unlock in
// flight, its outcome decides how the lock ended. t.mu is held.
func (t *tracker) keyGoneLocked() {
	if t.hold.phase != steady {
		t.hold.phase = releasedOrTaken
		return
	}
	t.end.end(ErrKeyDeleted) // reported, with every other end, by reportEnd
	t.l.finishLater()
}

// look asks the lock's waiter for its next step (queue.Waiter.Next),
// and records a grant or ends a lost lock. Once granted it stays held for
// recheck: no older key can appear, and the own-key watch reports the
// key's end. A lock granted with that watch down opens it only after
// ownWatchDelay (grant), sparing a short holding the event of its own
// Unlock, an uncontended lock's largest cost after its requests. ended:
// the lock has ended (see its context's cause), and is never held.
func (t *tracker) look(try bool) (st queue.Step, ended bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end.err() != nil {
		// Ended while waiting: never granted, whatever the view says.
		return queue.Step{}, true
	}
	if t.q == nil {
		return queue.Step{Kind: queue.StepHeld}, false // granted before
	}
	mirrored := t.q.Mirrored() && t.lookInMirror()
	st = t.q.Next(queue.Now{Own: t.w.own.Epoch(), Queue: t.queueEpoch(), Follow: t.w.fl().EpochOf}, try, mirrored)
	switch st.Kind {
	case queue.StepHeld:
		t.grant()
		if mirrored {
			t.q.Copied(t.w.mirror().only(t.key, t.token))
			t.w.mirror().leave(t, t.token)
		}
		t.dropWaiter()
	case queue.StepLost:
		t.lostLocked()
		return st, true
	}
	return st, false
}

// restQueue tells the queue watch whether the lock was granted with
// nobody else queued, so it rests while the name is uncontended. A
// Keeper's watch serves other sessions, whose waiters only its copy sees.
func (t *tracker) restQueue() {
	t.mu.Lock()
	alone := t.hold.alone
	t.mu.Unlock()
	if q := t.w.q(); q != nil {
		q.Granted(alone)
	}
}

// restOwn, as Unlock is about to delete the key, tells the own-key watch
// whether the lock was granted at once and held under ownWatchDelay, and
// reports whether the watch paused now, missing the delete. A lock held
// longer reopens the watch anyway: pausing would add a close and an open.
func (t *tracker) restOwn() bool {
	t.mu.Lock()
	g := t.hold.grantedAt
	brief := t.hold.atOnce && g != 0 && time.Since(t.s.born)-g < ownWatchDelay
	t.mu.Unlock()
	return t.w.own.Granted(brief)
}

// grant records that nothing is left ahead of the lock. If its own-key
// watch is not up, it is opened after ownWatchDelay. t.mu is held.
func (t *tracker) grant() {
	t.hold.granted = true
	if !t.w.own.Epoch().Up() && t.hold.watchOwn == nil {
		// The fired timer is let go of, so that a held lock does not keep
		// it (0.25 KB).
		t.hold.watchOwn = time.AfterFunc(ownWatchDelay, func() {
			t.mu.Lock()
			t.hold.watchOwn = nil
			t.mu.Unlock()
			t.w.own.Resume()
		})
	}
}

// dropWaiter keeps, of the granted lock's waiter, only how it was
// granted (restQueue, restOwn), and lets the rest go: its rule, its
// subscriptions' coverage, its follow epochs. From here on the lock's
// key's events and reads are judged as the rule judged them after the
// token (queue.EndsHolding), which is all the rule does for a lock
// granted: no older key can appear. t.mu is held.
func (t *tracker) dropWaiter() {
	t.hold.atOnce, t.hold.alone = t.q.AtOnce(), t.q.Alone()
	t.q = nil
}

// lookInMirror has the rule take the Keeper's copy, which holds every
// key under the name, as a read of the queue at its revision. It reports
// false once the copy of the lock's epoch is gone, and then puts the lock
// back on the queue watch's events. t.mu is held.
func (t *tracker) lookInMirror() bool {
	mv := t.w.mirror().snapshot(t.q.Epoch(), t.key, t.token, t.mode == Read)
	if !mv.OK {
		t.leaveCopyLocked()
		return false
	}
	t.q.Rule.Snapshot(mv.Rev, mv.Own, mv.Older, mv.Complete)
	return true
}

// wait blocks until the rule grants the lock, carrying out each step its
// waiter decides: near the head it follows the queue watch's deletions;
// further back, the newest keys ahead (follow), reading again as one goes.
// With try set it returns ErrLocked once it sees a key ahead. If ctx ends,
// the error names the key it waited behind.
func (t *tracker) wait(ctx context.Context, try bool) error {
	// The channel first, then the first look: news after this look pokes
	// it, news before it is in what the look sees.
	ch := make(chan struct{}, 1)
	t.changed.CompareAndSwap(nil, &ch)
	retry := backoff.New(10*time.Millisecond, time.Second)
	for {
		st, ended := t.look(try)
		if ended {
			return t.end.err()
		}
		if q := t.w.q(); st.PauseQueue && q != nil {
			// Far: the queue watch would only send every deletion.
			q.Pause()
		}
		switch st.Kind {
		case queue.StepHeld:
			return nil
		case queue.StepLocked:
			return lockedBy(st.Pred)
		}
		if err := retried(ctx, &retry, t.do(ctx, st)); err != nil {
			return behind(st.Pred, err)
		}
	}
}

// do carries out a step of a waiter: wait for news, or read what the rule
// lacks.
func (t *tracker) do(ctx context.Context, st queue.Step) error {
	switch st.Kind {
	case queue.StepWait:
		select {
		case <-*t.changed.Load():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case queue.StepReadOwn:
		return t.readOwn(ctx, st.MinRev)
	case queue.StepConfirmOwn:
		return t.confirmOwn(ctx)
	case queue.StepRereadFar:
		return t.rereadFar(ctx)
	case queue.StepFollow:
		return t.follow(ctx)
	case queue.StepReadNear:
		return t.rereadNear(ctx) // resumes the queue watch
	}
	return t.reread(ctx, st.MinRev)
}

// retried returns nil once a failed step of wait may run again after a
// backoff: a transient etcd error leaves the key queued, and ctx ends with
// the session. Otherwise it returns err, or ctx's error.
func retried(ctx context.Context, retry *backoff.Backoff, err error) error {
	if err == nil {
		retry.Reset()
		return nil
	}
	if ctx.Err() != nil || !rpcerr.Transient(ctx, err) {
		return err
	}
	return retry.Wait(ctx)
}

// confirmOwn opens the own-key watch of a lock that has to wait, and reads
// its key once the watch is up: a deletion before then went unseen.
func (t *tracker) confirmOwn(ctx context.Context) error {
	ownEpoch, err := t.w.own.UpEpoch(ctx, t)
	if err != nil {
		return err
	}
	if err := t.readOwn(ctx, t.w.own.UpRev()); err != nil {
		return err
	}
	t.mu.Lock()
	t.q.ConfirmedOwn(ownEpoch)
	t.mu.Unlock()
	return nil
}

// readOwn reads the own key at minRev, the token or later, for the rule;
// ErrKeyDeleted if the key is no longer this holding's.
func (t *tracker) readOwn(ctx context.Context, minRev int64) error {
	kv, rev, err := t.readOwnKey(ctx, minRev)
	if err != nil {
		return err
	}
	return t.ownRead(rev, kv)
}

// ownRead feeds the rule a read of the own key at rev (kv nil if absent).
// If the rule then knows the key is no longer this holding's, the lock
// ends (lostLocked) and ownRead returns ErrKeyDeleted.
func (t *tracker) ownRead(rev int64, kv *mvccpb.KeyValue) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.q != nil {
		t.q.Rule.OwnRead(rev, kv)
	} else if !t.owns(kv) {
		t.hold.keyEnded = true // as Rule.OwnRead judges it
	}
	if t.lostLocked() {
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

// reread reads the view at minRev or later once the own-key watch is up;
// watch deliveries during the read are applied after it.
func (t *tracker) reread(ctx context.Context, minRev int64) error {
	ownEpoch, err := t.w.own.UpEpoch(ctx, t)
	if err != nil {
		return err
	}
	return t.readView(ctx, ownEpoch, t.queueEpoch(), minRev)
}

// rereadNear reads the view once the queue watch is up, to keep it current.
func (t *tracker) rereadNear(ctx context.Context) error {
	epoch, err := t.queueUp(ctx)
	if err != nil {
		return err
	}
	ownEpoch, err := t.w.own.UpEpoch(ctx, t)
	if err != nil {
		return err
	}
	return t.readView(ctx, ownEpoch, epoch, 0)
}

// readView reads the view under the given watch epochs, reading older
// pages past a page of keys that do not block the lock.
func (t *tracker) readView(ctx context.Context, ownEpoch, epoch queue.Epoch, minRev int64) error {
	t.leaveCopy()
	pfx := t.name() + "/"
	maxRev := t.token - 1
	for {
		page, rev, err := t.readWithOwn(ctx, ownEpoch, epoch, minRev, func(opts ...clientv3.OpOption) clientv3.Op {
			return newestFirst(pfx, maxRev, t.page(), opts...)
		})
		if err != nil {
			return err
		}
		if len(page.Kvs) > 0 && page.Kvs[len(page.Kvs)-1].CreateRevision <= 1 {
			page.More = false // nothing is older than revision 1
		}
		t.setAhead(rev, page)
		if len(page.Kvs) == 0 || !page.More {
			return nil
		}
		t.mu.Lock()
		noneBlocks := t.q.Rule.AheadCount() == 0
		t.mu.Unlock()
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
func (t *tracker) readWithOwn(ctx context.Context, ownEpoch, epoch queue.Epoch, minRev int64, rng func(...clientv3.OpOption) clientv3.Op) (*pb.RangeResponse, int64, error) {
	follows := t.w.fl().Subscribe(t)
	// No older than the rule's read floor nor what the watches handed on:
	// an older read would show keys whose deletion no watch will send
	// again (the view took none of another epoch's events), and wait for
	// them.
	t.mu.Lock()
	seen := t.w.own.SeenRev()
	if epoch.Up() {
		seen = max(seen, t.w.q().SeenRev())
	}
	minRev = max(minRev, t.q.Read(ownEpoch, epoch, follows, seen))
	t.mu.Unlock()
	resp, err := keyread.ReadAtLeast(ctx, t.s.client, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(t.key, opts...), rng(opts...)}
	})
	if err != nil {
		return nil, 0, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; !t.ownsFirst(kvs) {
		// The read is at the token or later (the rule's read floor), so
		// the rule takes it as the key's end.
		if err := t.ownRead(resp.Header.Revision, keywrite.FirstKV(kvs)); err != nil {
			return nil, 0, err
		}
	}
	return resp.Responses[1].GetResponseRange(), resp.Header.Revision, nil
}

// recheck reads a held lock's key again after its own-key watch came up
// in epoch, when a deletion while it was down went unseen. The read is
// batched with other held locks' (keyread.Batcher) and its answer taken
// when it comes, while the watch goes on handing on its events: a held
// lock ends on a deletion that either shows, in whichever order they come
// (queue.Rule.OwnRead), so a deletion the watch delivers is not held up
// behind a backlog of reads (100,000 locks taken at once make one). If
// the read fails, the watch starts over, if still up in epoch, and reads
// again as it comes up.
func (t *tracker) recheck(epoch queue.Epoch) {
	t.mu.Lock()
	held := t.hold.granted
	t.mu.Unlock()
	if !held {
		return // a waiter reads its view again itself
	}
	own := t.w.own
	t.s.rechecks.Read(t.key, max(own.UpRev(), t.token), func(kv *mvccpb.KeyValue, rev int64, err error) {
		if err != nil {
			if t.s.ctx.Err() == nil {
				own.StartOver(epoch)
			}
			return
		}
		// A key gone ends the lock (ownRead); that is no failure of the read.
		_ = t.ownRead(rev, kv)
	})
}

// readOwnKey reads the lock's key (nil if absent) at minRev, the token or
// later. keyread.ReadAtLeast lets the client's member answer: a
// linearizable read waits out a member cut off from the quorum.
func (t *tracker) readOwnKey(ctx context.Context, minRev int64) (*mvccpb.KeyValue, int64, error) {
	resp, err := keyread.ReadAtLeast(ctx, t.s.client, max(minRev, t.token), func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(t.key, opts...)}
	})
	if err != nil {
		return nil, 0, err
	}
	return keywrite.FirstKV(resp.Responses[0].GetResponseRange().Kvs), resp.Header.Revision, nil
}

// ownsFirst is owns for the result of a read of the lock's key.
func (t *tracker) ownsFirst(kvs []*mvccpb.KeyValue) bool { return t.owns(keywrite.FirstKV(kvs)) }

// queueUp starts the queue watch if need be and waits until it is up, or
// ctx or the lock ends, returning its epoch.
func (t *tracker) queueUp(ctx context.Context) (queue.Epoch, error) {
	w, err := t.queueWatch()
	if err != nil {
		return 0, err
	}
	return w.UpEpoch(ctx, t)
}
