package queue

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Step is what the lock does next, as Waiter.Next decides it.
type Step struct {
	Kind StepKind
	// MinRev is, for a read, the lowest revision it may reflect.
	MinRev int64
	// Pred is the nearest key ahead (its key and creation revision), which
	// a waiter names; nil if the view holds none.
	Pred *mvccpb.KeyValue
	// PauseQueue: the lock is far, and the queue watch would only send it
	// every deletion: pause it before the step.
	PauseQueue bool
}

// StepKind is the kind of a Step.
type StepKind int

const (
	// StepWait: a watch will deliver what the rule lacks: wait for news.
	// It is the zero Step, which grants nothing.
	StepWait   StepKind = iota
	StepHeld            // granted: the lock is held
	StepLost            // the own key is gone or another's: the lock ends
	StepLocked          // TryLock's refusal: a key ahead holds the name (Pred)
	// StepReadOwn: read the own key at MinRev or later. The last deletion
	// ahead came from a watch that does not cover it, and a waiter whose
	// key went first must never be granted.
	StepReadOwn
	// StepConfirmOwn: open the own-key watch and, once it is up, read the
	// own key: a deletion while it was down went unseen.
	StepConfirmOwn
	// StepRead: read the view at MinRev or later once the own-key watch is
	// up, under the watches' epochs as they are.
	StepRead
	// StepReadNear: open the queue watch and read the view once it is up,
	// so that it keeps the view current.
	StepReadNear
	// StepFollow: follow the newest keys ahead (FollowKeys) and read them
	// once their watches are up.
	StepFollow
	// StepRereadFar: a followed key went: read the view again with the
	// queue watch up.
	StepRereadFar
)

// Now is what the lock's watches are as it looks: the own-key and queue
// watches' epochs, and the epoch of the follow watch of a key, if any.
type Now struct {
	Own, Queue Epoch
	Follow     func(key string) (Epoch, bool)
}

// SetToken records the lock's token (Rule.SetToken), with which the view
// about to be set is fresh: the first look may count as granted at once.
func (q *Waiter) SetToken(token int64) {
	q.Rule.SetToken(token)
	q.fresh = true
}

// Read records the watches' epochs under which the lock reads its view,
// and returns the lowest revision the read may reflect, given seen: the
// revisions the watches last handed on (an older read would show keys
// whose deletion no watch will send again).
func (q *Waiter) Read(ownEpoch, epoch Epoch, follows map[string]Epoch, seen int64) int64 {
	q.ownEpoch, q.epoch, q.followEpochs = ownEpoch, epoch, follows
	return max(q.Rule.ReadFloor(), seen)
}

// ConfirmedOwn records that the own-key watch is up in ownEpoch and the
// own key was read since it came up.
func (q *Waiter) ConfirmedOwn(ownEpoch Epoch) { q.ownEpoch = ownEpoch }

// Epoch is the queue watch's epoch as the view was read.
func (q *Waiter) Epoch() Epoch { return q.epoch }

// Page makes a page of the keys under the name, read at rev newest first
// with the own key (own), the rule's snapshot of the older keys that
// block the lock. more: the page ended before the oldest key, so older
// ones may lie past it. Kinds never change, so the last page stands for
// all of them.
func (q *Waiter) Page(rev int64, own *mvccpb.KeyValue, kvs []*mvccpb.KeyValue, more bool) {
	q.sharing = 0
	var listed []*mvccpb.KeyValue
	older := 0
	for _, kv := range kvs {
		if kv.CreateRevision >= q.Rule.token {
			continue
		}
		older++
		switch {
		case q.Rule.blocks(kv):
			listed = append(listed, kv)
		case q.cfg.IsQueueKey(kv):
			q.sharing++
		}
	}
	q.Rule.Snapshot(rev, own, listed, !more || older == 0)
	q.listed = q.Rule.AheadCount()
}

// Relist makes kvs, a keys-only read at rev of the keys older than the
// own key (own), the rule's snapshot if each key directly under the name
// in it is listed
// already, unchanged: the same creation and modification revisions. A
// keys-only read cannot tell whether a key blocks, but it shows that a
// put changed one (moved it off its lease, say), which no source may
// report: the full read then says what the key is now. Otherwise it
// reports false.
func (q *Waiter) Relist(rev int64, own *mvccpb.KeyValue, kvs []*mvccpb.KeyValue) bool {
	listed := make([]*mvccpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		if !q.cfg.IsChild(kv) {
			continue
		}
		a, ok := q.Rule.AheadOf(string(kv.Key))
		if !ok || a.Created != kv.CreateRevision || a.KV.ModRevision != kv.ModRevision {
			return false
		}
		listed = append(listed, a.KV)
	}
	q.Rule.Snapshot(rev, own, listed, true)
	q.listed, q.sharing = q.Rule.AheadCount(), 0
	return true
}

// FollowKeys are the keys a far waiter follows: the newest ahead.
func (q *Waiter) FollowKeys() []string {
	kvs := q.Rule.KeysAhead()
	keys := make([]string, 0, q.cfg.Follow)
	for _, kv := range kvs[:min(q.cfg.Follow, len(kvs))] {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// FollowFloor is the lowest revision a read of keys, followed keys ahead,
// may reflect: none older than the rule's read floor, nor than what the
// lock last knew of each.
func (q *Waiter) FollowFloor(keys []string) int64 {
	floor := q.Rule.ReadFloor()
	for _, k := range keys {
		if a, ok := q.Rule.AheadOf(k); ok {
			floor = max(floor, a.Through)
		}
	}
	return floor
}

// Followed takes a read at rev of followed keys (kvs[i] is keys[i] as
// read, nil if absent), made once their watches were up in epochs. A key
// found gone, made again, or changed so that it no longer blocks (moved
// off its lease, say) counts as gone; one still there is confirmed, and
// its watch's epoch recorded.
func (q *Waiter) Followed(rev int64, keys []string, kvs []*mvccpb.KeyValue, epochs map[string]Epoch) {
	for i, k := range keys {
		a, ok := q.Rule.AheadOf(k)
		if !ok {
			continue // its deletion came meanwhile
		}
		if kv := kvs[i]; kv == nil || kv.CreateRevision != a.Created || !q.Rule.blocks(kv) {
			q.Rule.GoneBy(k, rev)
			continue
		}
		q.Rule.Confirm(kvs[i], rev)
		if q.followEpochs == nil {
			q.followEpochs = make(map[string]Epoch, q.cfg.Follow)
		}
		q.followEpochs[k] = epochs[k]
	}
}

// FarDone records that a far waiter is about to read its view again with
// the queue watch up: it is near again unless the view says otherwise.
func (q *Waiter) FarDone() { q.far = q.far && q.seam.keepsFar() }

// Copied records whether the Keeper's copy held no key but the lock's as
// it was granted on it.
func (q *Waiter) Copied(only bool) { q.onlyKey = only }

// Alone tells whether the lock was granted at once with nobody else
// queued: on its session's own queue watch, or on a Keeper's copy that
// held no other key.
func (q *Waiter) Alone() bool { return q.atOnce && (!q.cfg.Shared || q.onlyKey) }

// AtOnce tells whether the lock was granted on its first look.
func (q *Waiter) AtOnce() bool { return q.atOnce }

// view is the rule's decision plus what a waiter needs to act on it.
type view struct {
	d        Decision
	unread   bool // no read of the queue has been taken yet
	ownStale bool // the own-key watch was not up all along since the view was read
	near     bool // few enough ahead (or only readers) to follow every deletion, or a shared watch
	current  bool // the queue watch has kept the view current since it was read
	far      bool // the lock follows only the newest keys ahead
	followed bool // ... and their watches keep the view current
	refollow bool // ... and one of them went: the view must be read again
	pred     *mvccpb.KeyValue
}

// Next decides the lock's next step from the rule and the watches as
// they are (now): granted, lost, TryLock's refusal (with try set), wait,
// or which read. mirrored: the lock looks in its Keeper's copy, which the
// rule has just taken as a read of the queue; the copy wakes it when a
// deletion may grant it, so it counts as near and current. Only the first
// look after the token may count as granted at once.
func (q *Waiter) Next(now Now, try, mirrored bool) Step {
	defer func() { q.fresh = false }()
	v := view{
		d:        q.Rule.Decide(),
		unread:   q.Rule.Base() == 0 && !mirrored,
		ownStale: q.ownStale(now.Own),
		near:     mirrored || q.cfg.Shared || (q.Rule.Complete() && (q.Rule.AheadCount()+q.sharing <= q.cfg.Near || q.onlyReadersAhead())),
		current:  mirrored || (q.epoch.Up() && q.epoch == now.Queue),
		pred:     q.nearestAhead(),
	}
	// Once far, a waiter stays far until a key it follows goes: it then
	// reads again with the queue watch up (StepRereadFar), and is near if
	// the view shows few enough ahead.
	if !mirrored && !q.cfg.Shared && (q.far || !v.near) {
		q.far = true
		v.far, v.followed, v.refollow = true, q.following(now), q.Rule.AheadCount() < q.listed && !q.seam.dropsRefollow()
	}
	st := q.step(v, try)
	st.Pred, st.PauseQueue = v.pred, v.far
	if st.Kind == StepHeld {
		q.atOnce = q.fresh
	}
	return st
}

// step is Next's choice once the view is taken.
func (q *Waiter) step(v view, try bool) Step {
	switch {
	case v.d.Kind == Granted:
		return Step{Kind: StepHeld}
	case v.d.Kind == Lost:
		return Step{Kind: StepLost}
	case try && !v.unread && v.pred != nil:
		// Held by another, whatever became of the own key.
		return Step{Kind: StepLocked}
	case v.d.Kind == Wait && !v.ownStale && !(v.far && !v.followed):
		// A watch will deliver what the rule lacks. The own-key watch stays
		// up even where the queue watch or the copy covers the own key: the
		// copy wakes only waiters a deletion may grant, and neither carries
		// a put that moves the key off the lease.
		return Step{Kind: StepWait}
	}
	return q.read(v)
}

// read is the read that gets the rule what it lacks.
func (q *Waiter) read(v view) Step {
	switch {
	case v.d.Kind == ReadOwn:
		return Step{Kind: StepReadOwn, MinRev: v.d.Rev}
	case v.ownStale && !v.unread && !q.seam.skipsConfirmOwn():
		return Step{Kind: StepConfirmOwn}
	case v.unread || v.pred == nil:
		// Unread, or the page held no queue key but older ones lie past it.
		return Step{Kind: StepRead, MinRev: v.d.Rev}
	case v.far && v.refollow:
		return Step{Kind: StepRereadFar}
	case v.far:
		return Step{Kind: StepFollow}
	case !v.current:
		return Step{Kind: StepReadNear}
	}
	return Step{Kind: StepRead, MinRev: v.d.Rev}
}

// ownStale tells whether the own-key watch was down since the view was
// read, given its epoch now; a fresh view is fine until the watch comes
// up.
func (q *Waiter) ownStale(cur Epoch) bool {
	if cur.Up() {
		return cur != q.ownEpoch
	}
	// Down now: an up-time since the read delivered its deletions, and its
	// next coming up rechecks a held lock.
	return !q.fresh
}

// following tells whether each key a far waiter follows has a watch up
// since before the read that showed or confirmed it, so that its
// deletion wakes the waiter.
func (q *Waiter) following(now Now) bool {
	keys := q.FollowKeys()
	if len(keys) == 0 {
		return false
	}
	for _, k := range keys {
		read, ok := q.followEpochs[k]
		if !ok || !read.Up() {
			return false
		}
		if cur, ok := now.Follow(k); !ok || cur != read {
			return false
		}
	}
	return true
}

// onlyReadersAhead tells whether every key ahead is a reader's: readers
// leave in any order, so a writer behind them follows every deletion
// rather than read again after each.
func (q *Waiter) onlyReadersAhead() bool { return q.Rule.AllAhead(q.cfg.IsReader) }

// nearestAhead is the newest key ahead, which a waiter names.
func (q *Waiter) nearestAhead() *mvccpb.KeyValue {
	if kvs := q.Rule.KeysAhead(); len(kvs) > 0 {
		return &mvccpb.KeyValue{Key: kvs[0].Key, CreateRevision: kvs[0].CreateRevision}
	}
	return nil
}
