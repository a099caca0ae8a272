package queue

import "go.etcd.io/etcd/api/v3/mvccpb"

// Waiter is how one lock waits for its turn: its Rule, and its
// subscriptions to the watches that feed the rule. The lock starts and
// ends a subscription only through these methods, which tell the rule in
// the same step, so that the rule never trusts a watch the lock no longer
// hears. Its caller guards it (package lease: the lock's mutex).
type Waiter struct {
	Rule *Rule
	cfg  Config
	// mirrored: the lock waits on its Keeper's copy of the queue, through
	// a subscription to the queue watch's downs only (JoinCopy).
	mirrored bool
	// sharing counts the older queue keys that do not block (readers',
	// for a reader): their deletions reach a queue-watch waiter too.
	sharing int
	// far: the lock follows only the newest keys ahead until one of them
	// goes; it then reads the view again with the queue watch up
	// (StepRereadFar), and is near if few enough are ahead. listed: the
	// keys ahead then; fewer now means one went.
	far    bool
	listed int
	// The watches' epochs as the view was read (Read): the own key's, the
	// queue's, and those of the keys a far waiter follows.
	ownEpoch, epoch Epoch
	followEpochs    map[string]Epoch
	// fresh: the view read with the put (or copy), not yet looked at.
	fresh bool
	// atOnce: granted on a fresh view; onlyKey: the copy held no other key.
	atOnce, onlyKey bool
	seam            waiterSeam
}

// Config is what a waiter is told of its lock once, as it is made.
type Config struct {
	// Shared: the lock waits on a Keeper's shared queue watch, which
	// hears every deletion at no cost per waiter: it is never far.
	Shared bool
	// Near is how many keys (blocking or sharing) may be ahead of a
	// waiter that follows every deletion through the queue watch; Follow
	// is how many of the newest keys ahead a far waiter follows.
	Near, Follow int
	// IsReader tells a reader's key; IsQueueKey a key of the name's queue
	// (a lock key directly under the name); IsChild a key directly under
	// the name, as a keys-only read shows it (with no lease).
	IsReader, IsQueueKey, IsChild func(kv *mvccpb.KeyValue) bool
}

// NewWaiter makes the waiter of a lock whose rule is rule.
func NewWaiter(rule *Rule, cfg Config) Waiter { return Waiter{Rule: rule, cfg: cfg} }

// Feed is a watch as a waiter subscribes to it: the watch's side of a
// subscription, which package lease implements on its watches and the
// explorer on its own.
type Feed interface {
	// Range is what the watch covers: its keys (nil for the whole queue)
	// and whether the own key is among them.
	Range() (keys []string, coversOwn bool)
	// Subscribe makes the lock a subscriber under the serial listen hands
	// out, unless it is one already or has ended. It returns the watch's
	// epoch (up or not), the revision of the last response it handed on
	// (read after the lock joined, so the lock misses nothing after it),
	// and the new serial (0 if none was made). viaCopy: the lock hears the
	// watch's downs but not its events or ups.
	Subscribe(viaCopy bool, listen func() Source) (epoch Epoch, seen int64, src Source)
	// Unsubscribe ends the lock's subscription, if any, and returns its
	// serial.
	Unsubscribe() (src Source, ok bool)
}

// Subscribe makes the lock a subscriber of f, unless it is one. A new
// subscription to a watch that is up covers the lock from the revision
// after the last response the watch handed on; one via the copy is left
// down (JoinCopy brings it up). It returns f's epoch and the new
// subscription's serial (0 if none was made).
func (q *Waiter) Subscribe(f Feed, viaCopy bool) (Epoch, Source) {
	keys, own := f.Range()
	epoch, seen, src := f.Subscribe(viaCopy, func() Source { return q.Rule.Listen(keys, own) })
	if src != 0 && epoch.Up() && !viaCopy {
		q.Rule.Up(src, epoch, seen+1)
	}
	return epoch, src
}

// Unsubscribe ends the lock's subscription to f, and the rule's trust in
// it.
func (q *Waiter) Unsubscribe(f Feed) {
	if src, ok := f.Unsubscribe(); ok {
		q.Rule.Unlisten(src)
	}
}

// JoinCopy moves the lock's queue subscription onto its Keeper's copy of
// the queue: one step ends the subscription to the queue watch f's events
// and starts one to its downs alone, up in epoch only, covering what the
// copy holds from base on. base is asked for once the new subscription is
// made; ok false means the copy of epoch is gone. JoinCopy reports false
// if f has left epoch or the copy is gone: the lock then leaves the copy
// (LeaveCopy) and reads.
func (q *Waiter) JoinCopy(f Feed, epoch Epoch, base func() (rev int64, ok bool)) bool {
	if src, ok := f.Unsubscribe(); ok && !q.seam.joinKeepsTrust() {
		q.Rule.Unlisten(src)
	}
	q.mirrored = true
	cur, src := q.Subscribe(f, true)
	rev, ok := base()
	left := cur != epoch && !q.seam.joinIgnoresEpoch()
	if (left || src == 0 || !ok) && !q.seam.joinNeverRefuses() {
		return false
	}
	q.Rule.Up(src, q.seam.copyEpoch(epoch), rev+1)
	return true
}

// LeaveCopy puts a lock that waited on the copy back on the queue watch
// f's events, and reports whether it waited on the copy. What it missed
// meanwhile, the new subscription does not cover: the rule reads.
func (q *Waiter) LeaveCopy(f Feed) bool {
	if !q.mirrored {
		return false
	}
	q.mirrored = q.seam.leaveKeepsMirrored()
	q.Unsubscribe(f)
	q.Subscribe(f, false)
	return true
}

// Mirrored tells whether the lock waits on its Keeper's copy.
func (q *Waiter) Mirrored() bool { return q.mirrored }
