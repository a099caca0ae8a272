package queue

import (
	"cmp"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Rule is what one lock knows of its queue, and the one rule that
// grants it. It is pure (no I/O, clock or goroutines); nothing else
// decides a grant.
//
// The rule: the lock is granted at revision G when, at G, its own key
// exists as this holding (its token, its lease, no put by anyone else
// since) and no older key that blocks it does. The lock knows that when
//   - a snapshot at revision R showed its own key as this holding and
//     listed every blocking key older than it (no older key can appear
//     after the own put, so only deletions matter after R);
//   - every listed key has been seen gone, by any source, at revisions up
//     to G, the highest of them (or R if none was listed): deleted, or
//     left in place by a put that makes it no lock that blocks (moved off
//     its lease, say);
//   - the own key is known unchanged through G: by a snapshot at G or
//     later, or by a source covering the own key that has delivered
//     everything up to G, with no gap since what was known before.
//
// A watch covers its range only from its start revision, so a snapshot
// counts with it only if taken at start-1 or later. One watch delivers in
// revision order, but two watches are in no order relative to each other:
// a deletion seen on one says nothing of what another has not delivered.
type Rule struct {
	key    string
	token  int64                          // the own key's creation revision; 0 until the put returns
	owns   func(kv *mvccpb.KeyValue) bool // kv shows this holding: its token, the session's lease
	blocks func(kv *mvccpb.KeyValue) bool // kv, a key older than the own, is a queue key that blocks it

	base     int64             // revision of the snapshot the view rests on; 0 before the first
	complete bool              // ... which listed every blocking key older than the own key
	ahead    map[string]*Ahead // blocking keys listed by it, not yet seen gone
	removed  map[string]int64  // listed keys seen gone, with the lowest revision known gone
	// gone is, by key, each revision it was seen gone at, ascending: a name
	// may go more than once, and events may come before the snapshot.
	gone  map[string][]int64
	ownTo int64 // the own key is known unchanged from the token through this revision
	// sources are the lock's subscriptions, each with its serial: exactly the watches
	// (or copies) it listens to. A subscription the lock ends is removed
	// in the same step (unlisten), and nothing it sends after counts.
	// A slice: a lock has a few at most, and a map cost 0.15 KB more.
	sources []*coverage
	serial  Source          // the last serial handed out
	lost    bool            // the own key was deleted or taken over: never granted
	early   []*mvccpb.Event // own-key events seen before the token (a watch may beat the put's answer)
	seam    grantSeam
}

// Ahead is a blocking key the snapshot listed.
type Ahead struct {
	Created int64            // its creation revision
	KV      *mvccpb.KeyValue // as last read: the lock uses it to choose how to wait
	Through int64            // highest revision it is known still there at: the snapshot's or confirm's
}

// Source is one subscription of the lock: to a watch, or to a Keeper's
// copy of the queue. Serials are never reused within a lock, so news of a
// subscription that ended can never be taken for a later one's.
type Source uint64

// coverage is what one subscription delivers while up: every event of its
// range from start on, in revision order, up to progress.
type coverage struct {
	src       Source // the subscription's serial
	up        bool
	gen       Epoch // the generation it is up in (a watch's epoch)
	over      Epoch // generations below this are over: news of their up may come after their down
	start     int64
	progress  int64
	coversOwn bool     // its range holds the own key
	keys      []string // the keys it covers; nil for the whole queue
}

func (c *coverage) covers(key string) bool { return c.keys == nil || slices.Contains(c.keys, key) }

// Base is the revision of the snapshot the view rests on; 0 before the
// first.
func (k *Rule) Base() int64 { return k.base }

// Complete tells whether that snapshot listed every blocking key older
// than the own key.
func (k *Rule) Complete() bool { return k.complete }

// AheadCount is how many listed keys are not yet seen gone.
func (k *Rule) AheadCount() int { return len(k.ahead) }

// AheadOf returns listed key key as last known, if it is not yet seen gone.
func (k *Rule) AheadOf(key string) (Ahead, bool) {
	a, ok := k.ahead[key]
	if !ok {
		return Ahead{}, false
	}
	return *a, true
}

// Lost tells whether the own key is known deleted or taken over after the
// token: the lock is never granted, and a held one has ended.
func (k *Rule) Lost() bool { return k.lost }

// AllAhead tells whether f holds for every key ahead, as last read.
func (k *Rule) AllAhead(f func(kv *mvccpb.KeyValue) bool) bool {
	for _, a := range k.ahead {
		if !f(a.KV) {
			return false
		}
	}
	return true
}

// Decision is what the lock does next.
type Decision struct {
	Kind DecisionKind
	Rev  int64 // granted: the revision of the grant; read: the lowest revision the read may reflect
}

type DecisionKind int

const (
	Wait    DecisionKind = iota // a source will deliver what is missing
	Read                        // read a snapshot at rev or later
	ReadOwn                     // read the own key at rev or later
	Granted                     // held since rev
	Lost                        // the own key is gone: never held
)

func NewRule(key string, owns, blocks func(*mvccpb.KeyValue) bool) *Rule {
	return &Rule{key: key, owns: owns, blocks: blocks} // maps made at their first write
}

// SetToken records the own key's creation revision, at which it is this
// holding.
func (k *Rule) SetToken(token int64) {
	k.token, k.ownTo = token, max(k.ownTo, token)
	for _, ev := range k.early {
		k.ownEvent(ev)
	}
	k.early = nil
	k.extend()
}

// OwnRead takes a read of the own key at rev (kv nil if absent). Found with
// its token, it lasted from the token to rev: one made again is newer. Not
// found, the holding is over, whatever rev is: a read below the token
// comes only from a store whose revisions went back (etcd restored from a
// snapshot without a bump), where the key the lock put is gone too.
func (k *Rule) OwnRead(rev int64, kv *mvccpb.KeyValue) {
	if k.token == 0 || k.lost {
		return
	}
	if !k.owns(kv) {
		k.lost = true
		return
	}
	if rev < k.token {
		return
	}
	k.ownTo = max(k.ownTo, rev)
	k.extend()
}

// Snapshot takes a read at rev: the own key (nil if absent) and the older
// queue keys that block it; complete says no older key lies past what was
// read. A snapshot older than the current base is dropped.
func (k *Rule) Snapshot(rev int64, own *mvccpb.KeyValue, older []*mvccpb.KeyValue, complete bool) {
	if k.token == 0 || rev < k.token || rev < k.base || k.lost {
		return
	}
	if !k.owns(own) {
		k.lost = true
		return
	}
	k.ownTo = max(k.ownTo, rev)
	k.base, k.complete = rev, complete
	// Made only when something is listed: a lock granted at once keeps
	// neither.
	k.removed, k.ahead = nil, nil
	if len(older) > 0 {
		k.removed = map[string]int64{}
		k.ahead = make(map[string]*Ahead, len(older))
	}
	for _, kv := range older {
		key := string(kv.Key)
		if kv.CreateRevision >= k.token {
			continue
		}
		// A deletion seen after rev is of this key (one made again is newer).
		if d, ok := k.goneAfter(key, rev); ok {
			k.removed[key] = d
			continue
		}
		k.ahead[key] = &Ahead{Created: kv.CreateRevision, Through: rev, KV: kv}
	}
	for key, ds := range k.gone {
		i, _ := slices.BinarySearch(ds, rev+1)
		if ds = ds[i:]; len(ds) == 0 {
			delete(k.gone, key)
		} else {
			k.gone[key] = ds
		}
	}
	k.extend()
}

// goneAfter is the first revision after rev at which key was seen gone.
func (k *Rule) goneAfter(key string, rev int64) (int64, bool) {
	ds := k.gone[key]
	i, _ := slices.BinarySearch(ds, rev+1)
	if i == len(ds) {
		return 0, false
	}
	return ds[i], true
}

// Confirm takes a read at rev that showed key ahead kv still there: a
// watch of it started by rev+1 delivers its deletion.
func (k *Rule) Confirm(kv *mvccpb.KeyValue, rev int64) {
	if a := k.ahead[string(kv.Key)]; a != nil && a.Created == kv.CreateRevision {
		a.Through, a.KV = max(a.Through, rev), kv
	}
}

// KeysAhead returns the keys ahead, as last read, newest first.
func (k *Rule) KeysAhead() []*mvccpb.KeyValue {
	kvs := make([]*mvccpb.KeyValue, 0, len(k.ahead))
	for _, a := range k.ahead {
		kvs = append(kvs, a.KV)
	}
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(b.CreateRevision, a.CreateRevision) })
	return kvs
}

// GoneBy takes a read at rev that showed a key ahead gone (made again,
// newer than the own key, or no longer blocking): it counts as gone at rev.
func (k *Rule) GoneBy(key string, rev int64) { k.sawGone(key, rev) }

// sawGone records that key is gone by rev. The first deletion after the
// snapshot is of the listed key (later ones are of keys made again, newer
// than the own), so the lowest known revision counts: a delete event that
// comes after a read found the key gone lowers the grant's revision.
func (k *Rule) sawGone(key string, rev int64) {
	if rev <= k.base {
		return
	}
	ds := k.gone[key]
	if i, found := slices.BinarySearch(ds, rev); !found {
		if k.gone == nil {
			k.gone = map[string][]int64{}
		}
		k.gone[key] = slices.Insert(ds, i, rev)
	}
	if _, ok := k.ahead[key]; ok {
		delete(k.ahead, key)
		k.removed[key] = rev // made with ahead (Snapshot)
	} else if d, ok := k.removed[key]; ok && rev < d {
		k.removed[key] = rev
	}
}

// deleted is the revision by which every listed key seen gone is gone.
func (k *Rule) deleted() int64 {
	var d int64
	for _, r := range k.removed {
		d = max(d, r)
	}
	return d
}

// Listen starts a subscription to a source of keys (nil for the whole
// queue) and returns its serial. It vouches for nothing until up.
func (k *Rule) Listen(keys []string, coversOwn bool) Source {
	k.serial++
	c := &coverage{coversOwn: coversOwn}
	if keys != nil {
		c.keys = slices.Clip(keys) // a few keys at most: a map cost a lock 0.2 KB each
	}
	c.src = k.serial
	k.sources = append(k.sources, c)
	return k.serial
}

// source is subscription src's coverage; nil if it has ended.
func (k *Rule) source(src Source) *coverage {
	for _, c := range k.sources {
		if c.src == src {
			return c
		}
	}
	return nil
}

// Unlisten ends subscription src: from now on it vouches for nothing.
func (k *Rule) Unlisten(src Source) {
	k.sources = slices.DeleteFunc(k.sources, func(c *coverage) bool { return c.src == src })
}

// Up records that src, in generation gen, delivers every event of its
// range from start on. A newer generation starts over; an older one, one
// already over, a second up of the current, or an ended subscription's is
// dropped.
func (k *Rule) Up(src Source, gen Epoch, start int64) {
	c := k.source(src)
	if c == nil || gen < c.over || (c.up && c.gen >= gen) {
		return
	}
	c.up, c.gen, c.start, c.progress = true, gen, start, start-1
	k.extend()
}

// Down records that src stopped in generation gen (and all before it):
// it vouches for nothing after what it delivered.
func (k *Rule) Down(src Source, gen Epoch) {
	c := k.source(src)
	if c == nil {
		return
	}
	if c.up && c.gen <= gen {
		c.up = false
	}
	c.over = max(c.over, gen+1)
}

// Events takes one response of src in generation gen: every event of its
// range up to progress (at least the last event's) is delivered. Each
// event is applied; only a source up in gen vouches for the rest.
func (k *Rule) Events(src Source, gen Epoch, evs []*mvccpb.Event, progress int64) {
	for _, ev := range evs {
		k.event(ev)
		progress = max(progress, ev.Kv.ModRevision)
	}
	if c := k.source(src); c != nil && c.up && c.gen == gen {
		c.progress = max(c.progress, progress)
		k.extend()
	}
}

func (k *Rule) event(ev *mvccpb.Event) {
	key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
	if key == k.key {
		k.ownEvent(ev)
		return
	}
	if !k.mayList(key) {
		return
	}
	switch {
	case ev.Type == mvccpb.DELETE:
		k.sawGone(key, rev)
	case (k.token == 0 || ev.Kv.CreateRevision < k.token) && !k.blocks(ev.Kv):
		// A put left a key in place but no longer blocking (moved off its
		// lease, say): it is no lock from now on, as if gone. Before the
		// token is known every key counts; after, a key made again is
		// newer than the own and never blocks.
		k.sawGone(key, rev)
	}
}

// mayList tells whether a change of key can matter to the rule: until a
// complete snapshot any key may be listed by the next; after one, only a
// key it listed (keys older than the own cannot appear, and one that did
// not block then is not followed). Others are not recorded, so that data
// kept under the name, written again and again, costs the rule nothing.
func (k *Rule) mayList(key string) bool {
	if k.base == 0 || !k.complete || k.ahead[key] != nil {
		return true
	}
	_, ok := k.removed[key]
	return ok
}

// ownEvent applies an own-key event: after the token, a deletion or a put
// that makes it not this holding's ends the holding.
func (k *Rule) ownEvent(ev *mvccpb.Event) {
	if k.token == 0 {
		k.early = append(k.early, ev)
		return
	}
	if EndsHolding(k.token, k.owns, ev) {
		k.lost = true
	}
}

// EndsHolding tells whether ev, an event of the own key of the holding
// whose token is token, ends it: a deletion, or a put that makes it not
// this holding's (owns false), after the token. An event at or before
// the token is an earlier holding's. The rule applies it to a waiter's
// own-key events and a held lock, which keeps no rule, to its own.
func EndsHolding(token int64, owns func(kv *mvccpb.KeyValue) bool, ev *mvccpb.Event) bool {
	if ev.Kv.ModRevision <= token {
		return false
	}
	after := ev.Kv
	if ev.Type == mvccpb.DELETE {
		after = nil
	}
	return !owns(after)
}

// extend carries ownTo forward through sources covering the own key with
// no gap: one started by ownTo+1 vouches for it up to its progress.
func (k *Rule) extend() {
	for moved := true; moved; {
		moved = false
		for _, c := range k.sources {
			if c.up && c.coversOwn && k.contiguous(c.start, k.ownTo) && c.progress > k.ownTo {
				k.ownTo, moved = c.progress, true
			}
		}
	}
}

// contiguous tells whether a source started at start follows rev with no gap.
func (k *Rule) contiguous(start, rev int64) bool {
	if k.seam.ignoresStart() {
		return true
	}
	return start <= rev+1
}

func (k *Rule) Decide() Decision {
	switch {
	case k.lost:
		return Decision{Kind: Lost}
	case k.base == 0 || (len(k.ahead) == 0 && !k.complete):
		// Unread, or a partial snapshot's keys are all gone: older ones
		// may lie past what it read.
		return Decision{Kind: Read, Rev: k.ReadFloor()}
	case len(k.ahead) == 0:
		return k.decideEmpty()
	case k.ownWatched() && k.watched():
		return Decision{Kind: Wait}
	}
	// A waiter must hear at once that its own key went, and of keys
	// ahead going: without a source on both, only a read tells.
	return Decision{Kind: Read, Rev: k.ReadFloor()}
}

// decideEmpty decides once no key ahead is left: granted if the own key
// is known unchanged through the last deletion.
func (k *Rule) decideEmpty() Decision {
	g := max(k.base, k.deleted())
	switch {
	case k.ownTo >= g || k.seam.ignoresOwn():
		return Decision{Kind: Granted, Rev: g}
	case k.ownWillReach():
		return Decision{Kind: Wait}
	}
	return Decision{Kind: ReadOwn, Rev: g}
}

// ReadFloor is the lowest revision a useful read may reflect: no older than
// what the view has seen, nor than any source's start-1 (no gap).
func (k *Rule) ReadFloor() int64 {
	floor := max(k.token, k.base, k.deleted())
	for _, ds := range k.gone {
		floor = max(floor, ds[len(ds)-1])
	}
	for _, c := range k.sources {
		if c.up {
			floor = max(floor, c.start-1)
		}
	}
	return floor
}

// watched tells whether a source up covers some key ahead with no gap:
// while that key stays, uncovered ones cannot grant the lock.
func (k *Rule) watched() bool {
	for key, a := range k.ahead {
		for _, c := range k.sources {
			if c.up && c.covers(key) && k.contiguous(c.start, a.Through) {
				return true
			}
		}
	}
	return false
}

// ownWatched tells whether a source up covers the own key with no gap
// since ownTo: a change of it will be delivered.
func (k *Rule) ownWatched() bool {
	for _, c := range k.sources {
		if c.up && c.coversOwn && k.contiguous(c.start, k.ownTo) {
			return true
		}
	}
	return false
}

// ownWillReach tells whether a source up covers the own key and the whole
// queue with no gap: it delivers the last deletion in order with any own
// key change before it, so waiting carries ownTo to the grant.
func (k *Rule) ownWillReach() bool {
	for _, c := range k.sources {
		if c.up && c.coversOwn && c.keys == nil && k.contiguous(c.start, k.ownTo) {
			return true
		}
	}
	return false
}
