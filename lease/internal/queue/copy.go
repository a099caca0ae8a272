package queue

import (
	"cmp"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Copy is a Keeper's copy of every key under one lock name, kept by the
// name's shared queue watch: read as the watch comes up (Install), moved
// forward by every event the watch hands on after that (Apply), dropped
// as the watch goes down (Drop). Its caller guards it and carries out what
// it says (package lease: queueMirror).
//
// A lock joins only once the copy has applied its own put, in the epoch
// it subscribed in: the watch was up before the put and delivers every
// event in order, so the copy is then exactly what a read at its revision
// would give, and the lock's rule takes it as such (Snapshot). The copy
// decides nothing: it says which of its waiters a deletion may grant, or
// has ended by deleting its key (Apply's heads), and their rules decide. Too many keys turn it off: it
// then only counts keys until they are few enough to read it again.
type Copy struct {
	cfg      CopyConfig
	valid    bool  // the copy is complete for epoch
	counting bool  // the copy is off for epoch: too many keys
	count    int   // how many keys are under the name at rev, while counting
	epoch    Epoch // the watch epoch the copy (or the count) belongs to
	base     int64 // the revision of the read the copy (or the count) started from
	rev      int64 // the newest revision applied
	keys     map[string]*mvccpb.KeyValue
	// The queue keys, and the writers' among them, oldest first. Keys
	// mostly leave from the front, where dead entries are skipped.
	queue, writers order
	waiters        map[int64]bool // the waiters on the copy, by token: whether a reader's
	readers        int            // how many of the waiters are readers
	seam           copySeam
}

// CopyConfig is what a copy is told of its name once, as it is made.
type CopyConfig struct {
	// IsQueueKey tells a key of the name's queue; IsWriter a writer's
	// queue key.
	IsQueueKey, IsWriter func(kv *mvccpb.KeyValue) bool
	// Limit is the most keys the copy keeps; above it, it counts them
	// until they are down to Resume. Slack is how many dead entries an
	// order list may hold beyond twice the live keys.
	Limit, Resume, Slack int
}

// NewCopy makes an empty copy, invalid until Install.
func NewCopy(cfg CopyConfig) *Copy { return &Copy{cfg: cfg} }

// order lists queue keys by creation revision; dead ones stay until they
// reach the front or compact drops them.
type order struct {
	entries []orderEntry
	front   int
}

type orderEntry struct {
	key string
	rev int64 // creation revision
}

// Wake is whom a change of the copy wakes: every waiter, or the heads, the
// waiters a deletion may grant (by token).
type Wake struct {
	All   bool
	Heads []int64
}

// Install makes kvs, a read at rev of the keys under the name, the copy
// (or count) of epoch; more: the read holds only the first of count keys.
func (c *Copy) Install(kvs []*mvccpb.KeyValue, more bool, count int, rev int64, epoch Epoch) Wake {
	c.epoch, c.base, c.rev = epoch, rev, rev
	if more {
		return c.goCounting(count)
	}
	c.keys = make(map[string]*mvccpb.KeyValue, len(kvs))
	for _, kv := range kvs {
		c.keys[string(kv.Key)] = kv
	}
	c.valid, c.counting, c.count = true, false, 0
	c.rebuildOrder()
	return Wake{}
}

// goCounting turns the copy off (n keys) and wakes its waiters.
func (c *Copy) goCounting(n int) Wake {
	c.valid, c.counting, c.count = false, true, n
	c.keys, c.queue, c.writers = nil, order{}, order{}
	return Wake{All: true}
}

// rebuildOrder lists the copy's queue keys in order.
func (c *Copy) rebuildOrder() {
	c.queue, c.writers = order{}, order{}
	kvs := make([]*mvccpb.KeyValue, 0, len(c.keys))
	for _, kv := range c.keys {
		if c.cfg.IsQueueKey(kv) {
			kvs = append(kvs, kv)
		}
	}
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	for _, kv := range kvs {
		c.queue.entries = append(c.queue.entries, orderEntry{string(kv.Key), kv.CreateRevision})
		if c.cfg.IsWriter(kv) {
			c.writers.entries = append(c.writers.entries, orderEntry{string(kv.Key), kv.CreateRevision})
		}
	}
}

// Events is one watch response's events, in revision order: n of them, the
// i-th at(i). (Package lease hands on etcd client's own event type, which
// is mvccpb.Event's alias in some client versions and a copy of it in
// others; taking them one at a time spares a conversion of the slice.)
type Events struct {
	N  int
	At func(i int) *mvccpb.Event
}

// Apply moves the copy of epoch forward by events, in revision order, and
// says whom to wake: the waiters a deletion may grant, and those whose own
// key a deletion removed. While the copy is
// off it counts keys instead, and reload says they are now few enough to
// read the copy again. Events of another epoch are dropped. The heads are
// appended to buf[:0], so that a caller that keeps buf allocates nothing.
func (c *Copy) Apply(events Events, epoch Epoch, buf []int64) (wake Wake, reload bool) {
	switch {
	case c.epoch != epoch:
		return Wake{}, false
	case c.valid:
		return c.applyCopy(events, buf), false
	case c.counting:
		return Wake{}, c.applyCount(events)
	}
	return Wake{}, false
}

// applyCopy is Apply for a valid copy.
func (c *Copy) applyCopy(events Events, buf []int64) Wake {
	deleted, reordered := false, false
	wake := buf[:0]
	for i := range events.N {
		ev := events.At(i)
		if ev.Kv.ModRevision <= c.base {
			continue
		}
		if old := c.keys[string(ev.Kv.Key)]; ev.Type == mvccpb.DELETE && old != nil {
			if _, ok := c.waiters[old.CreateRevision]; ok {
				// A waiter's own key went: it ends, and must hear it even
				// with its own-key watch down.
				wake = append(wake, old.CreateRevision)
			}
		}
		d, r := c.applyEvent(ev)
		deleted, reordered = deleted || d, reordered || r
		c.rev = max(c.rev, ev.Kv.ModRevision)
	}
	switch {
	case len(c.keys) > c.cfg.Limit:
		return c.goCounting(len(c.keys))
	case reordered:
		c.rebuildOrder()
		return Wake{All: true}
	case deleted:
		// Only a deletion makes an entry dead.
		c.compact(&c.queue, false)
		c.compact(&c.writers, true)
		return c.heads(wake)
	}
	return Wake{}
}

// applyEvent applies one event to the copy, and tells whether it deleted
// a key and whether it changed the order lists.
func (c *Copy) applyEvent(ev *mvccpb.Event) (deleted, reordered bool) {
	key := string(ev.Kv.Key)
	old := c.keys[key]
	switch {
	case ev.Type == mvccpb.DELETE:
		delete(c.keys, key)
		return old != nil, false
	case old != nil && old.CreateRevision == ev.Kv.CreateRevision:
		// A key changed in place (a leader's proclamation): its place
		// stays, but whether it is a writer's may have changed.
		c.keys[key] = ev.Kv
		return false, c.cfg.IsWriter(old) != c.cfg.IsWriter(ev.Kv) || c.cfg.IsQueueKey(old) != c.cfg.IsQueueKey(ev.Kv)
	}
	// A new key is the newest.
	c.keys[key] = ev.Kv
	if c.cfg.IsQueueKey(ev.Kv) {
		c.queue.entries = append(c.queue.entries, orderEntry{key, ev.Kv.CreateRevision})
		if c.cfg.IsWriter(ev.Kv) {
			c.writers.entries = append(c.writers.entries, orderEntry{key, ev.Kv.CreateRevision})
		}
	}
	return false, false
}

// applyCount is Apply while the copy is off, and tells whether the keys
// are now few enough to read the copy again.
func (c *Copy) applyCount(events Events) (reload bool) {
	for i := range events.N {
		ev := events.At(i)
		if ev.Kv.ModRevision <= c.base {
			continue
		}
		// etcd sends a deletion only for a key that was there, and a put
		// of a key that was not has it created at that revision.
		switch {
		case ev.Type == mvccpb.DELETE:
			c.count--
		case ev.Type == mvccpb.PUT && ev.Kv.CreateRevision == ev.Kv.ModRevision:
			c.count++
		}
		c.rev = max(c.rev, ev.Kv.ModRevision)
	}
	return c.count <= c.cfg.Resume
}

// Current tells whether the copy (or its count) is of epoch: Apply then
// moves it.
func (c *Copy) Current(epoch Epoch) bool { return c.epoch == epoch && (c.valid || c.counting) }

// Reloadable tells whether a read of the copy, made after it went off,
// may be installed: it is still off, in epoch. rev is the newest revision
// counted, which the read must not be older than.
func (c *Copy) Reloadable(epoch Epoch) (rev int64, ok bool) {
	return c.rev, c.counting && c.epoch == epoch
}

// compact drops o's dead entries once o holds more than twice the copy's
// keys plus the slack: at least half are then dead, so the cost is O(1)
// per event, amortised.
func (c *Copy) compact(o *order, writers bool) {
	if len(o.entries) <= 2*len(c.keys)+c.cfg.Slack {
		return
	}
	live := make([]orderEntry, 0, len(c.keys))
	for _, e := range o.entries[o.front:] {
		if c.live(e, writers) {
			live = append(live, e)
		}
	}
	o.entries, o.front = live, 0
}

// live tells whether e's key is in the copy with e's creation revision
// (and, for writers, still a writer's).
func (c *Copy) live(e orderEntry, writers bool) bool {
	kv := c.keys[e.key]
	return kv != nil && kv.CreateRevision == e.rev && (!writers || c.cfg.IsWriter(kv))
}

// heads adds to wake the waiters that may hold the lock now: the oldest
// key's waiter, and every reader older than the oldest writer.
func (c *Copy) heads(wake []int64) Wake {
	if len(c.waiters) == 0 {
		return Wake{}
	}
	heads := wake
	head := c.oldest(&c.queue, false)
	if _, ok := c.waiters[head]; ok && !c.seam.missesHead() {
		heads = append(heads, head)
	}
	if c.readers == 0 {
		return Wake{Heads: heads}
	}
	writer := c.oldest(&c.writers, true)
	for token, reader := range c.waiters {
		if reader && token != head && (writer == 0 || token < writer) {
			heads = append(heads, token)
		}
	}
	return Wake{Heads: heads}
}

// oldest is the creation revision of o's oldest live key, or 0.
func (c *Copy) oldest(o *order, writers bool) int64 {
	for ; o.front < len(o.entries); o.front++ {
		if e := o.entries[o.front]; c.live(e, writers) {
			return e.rev
		}
	}
	o.entries, o.front = o.entries[:0], 0
	return 0
}

// CopyView is the copy's snapshot for one lock: what a read of the queue
// at Rev, one page of a single key, would have shown it.
type CopyView struct {
	OK       bool               // there is a copy of the lock's epoch; the rest is unset if not
	Rev      int64              // the revision the copy is the state of
	Base     int64              // the revision the copy was read at: it holds every event after
	Own      *mvccpb.KeyValue   // the lock's own key in the copy; nil if absent
	Older    []*mvccpb.KeyValue // the newest queue key older than the lock's token that blocks it, if any
	Complete bool               // no blocking key is older than those listed: none is listed
}

// Snapshot is the copy of epoch as the rule of the lock with key and
// token takes a read of one page: its own key and the nearest key older
// than its token that blocks it (reader: the lock is a reader's, blocked
// by writers only), with Complete set if there is none. A waiter looks
// again whenever the copy wakes it, so the nearest key is all its rule
// needs; the copy finds it in its order lists at no cost per key ahead.
func (c *Copy) Snapshot(epoch Epoch, key string, token int64, reader bool) CopyView {
	if !c.valid || c.epoch != epoch {
		return CopyView{}
	}
	v := CopyView{OK: true, Own: c.keys[key], Rev: c.rev, Base: c.base}
	o, writers := &c.queue, false
	if reader {
		o, writers = &c.writers, true
	}
	if head := c.oldest(o, writers); head == 0 || head >= token {
		v.Complete = true
		return v
	}
	i, _ := slices.BinarySearchFunc(o.entries[o.front:], token, func(e orderEntry, t int64) int { return cmp.Compare(e.rev, t) })
	for j := o.front + i - 1; j >= o.front; j-- {
		if e := o.entries[j]; c.live(e, writers) {
			v.Older = []*mvccpb.KeyValue{c.keys[e.key]}
			break
		}
	}
	return v
}

// Ahead counts the keys in the copy older than token that block its lock
// (reader: a reader's): a walk over them. ok is false if there is no copy.
func (c *Copy) Ahead(token int64, reader bool) (n int, ok bool) {
	if !c.valid {
		return 0, false
	}
	o, writers := &c.queue, false
	if reader {
		o, writers = &c.writers, true
	}
	i, _ := slices.BinarySearchFunc(o.entries[o.front:], token, func(e orderEntry, t int64) int { return cmp.Compare(e.rev, t) })
	for _, e := range o.entries[o.front : o.front+i] {
		if c.live(e, writers) {
			n++
		}
	}
	return n, true
}

// Only tells whether the key made at token is the only key under the name.
func (c *Copy) Only(key string, token int64) bool {
	own := c.keys[key]
	return c.valid && len(c.keys) == 1 && own != nil && own.CreateRevision == token
}

// Join registers the waiter of token (reader: a reader's) once the copy of
// epoch has applied its put. joined: it is a waiter now; wait: the copy
// has not applied the put yet, and may. Neither: there is no copy of
// epoch, and the lock reads its view.
func (c *Copy) Join(epoch Epoch, token int64, reader bool) (joined, wait bool) {
	if !c.valid || c.epoch != epoch {
		return false, false
	}
	if c.rev < token {
		return false, true
	}
	if c.waiters == nil {
		c.waiters = make(map[int64]bool)
	}
	if _, ok := c.waiters[token]; !ok && reader {
		c.readers++
	}
	c.waiters[token] = reader
	return true, false
}

// Leave unregisters the waiter of token, if it is one.
func (c *Copy) Leave(token int64) {
	if reader, ok := c.waiters[token]; ok {
		delete(c.waiters, token)
		if reader {
			c.readers--
		}
	}
}

// Drop drops the copy as the watch goes down: every waiter is woken.
func (c *Copy) Drop() Wake {
	c.valid, c.counting, c.count, c.keys = false, false, 0, nil
	c.queue, c.writers = order{}, order{}
	return Wake{All: true}
}

// CopyState is a copy's state, for tests.
type CopyState struct {
	Valid, Counting          bool
	Count, Keys              int
	Queue, QueueCap, Writers int
	Rev                      int64
	Epoch                    Epoch
}

// State is the copy's state, for tests.
func (c *Copy) State() CopyState {
	return CopyState{Valid: c.valid, Counting: c.counting, Count: c.count, Keys: len(c.keys),
		Queue: len(c.queue.entries), QueueCap: cap(c.queue.entries), Writers: len(c.writers.entries),
		Rev: c.rev, Epoch: c.epoch}
}
