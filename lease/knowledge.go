package lease

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// knowledge is what one lock knows of its queue, and the one rule that
// grants it. It is pure: it does no I/O, keeps no time and starts nothing.
// The lock feeds it what its reads and watches tell, each fact tagged with
// the revision it reflects and the source it came from, and asks decide
// what to do next. Nothing else decides a grant.
//
// The rule: the lock is granted at revision G when, at G, its own key
// exists as this holding (its token, its lease, no put by anyone else
// since) and no key older than its own that blocks it does. The lock knows
// that when
//   - a snapshot at some revision R (a read at one revision, or a copy of
//     the queue kept in order) showed its own key as this holding and
//     listed every blocking key older than it: keys older than the lock's
//     own cannot appear after it was put, so only deletions matter after R;
//   - every key that snapshot listed has been seen deleted, by any source,
//     at revisions up to G, the highest of them (or R if it listed none);
//   - its own key is known unchanged through G: by a snapshot at G or
//     later, or by a source that covers the own key (its own watch, the
//     queue watch) and has delivered everything up to G, with no gap
//     between what that source covers and what a snapshot or another such
//     source covered before.
//
// A watch covers its range from the revision it started at: a watch that
// started after the snapshot cannot vouch for what happened between them,
// so a snapshot counts with a watch only if it was taken no earlier than
// the revision before the watch's start. Events are delivered by one
// watch in revision order, but two watches' events come in no fixed order
// relative to each other: a deletion seen on one watch says nothing of
// what another has not delivered yet.
type knowledge struct {
	key   string
	token int64 // the own key's creation revision
	lease int64 // the session's lease, which the own key is attached to
	// blocks tells whether a queue key older than the own key keeps the
	// lock from being held (any key for a writer, a writer's for a reader).
	blocks func(kv *mvccpb.KeyValue) bool

	base     int64            // revision of the snapshot the view rests on; 0 before the first
	complete bool             // ... which listed every blocking key older than the own key
	ahead    map[string]int64 // blocking keys listed by it, not yet seen deleted: key -> creation revision
	deleted  int64            // highest revision at which a key ahead was seen deleted
	gone     map[string]int64 // deletions seen after base, by key, for a later snapshot older than them
	ownTo    int64            // the own key is known unchanged from the token through this revision
	sources  map[source]*coverage
	lost     bool // the own key was deleted or taken over: never granted
	seam     grantSeam
}

// source names where a fact came from: the own key's watch, the queue
// watch, a watch of one key ahead, a copy of the queue.
type source string

// coverage is what one source delivers: every event of its range from
// start on, in revision order, up to progress.
type coverage struct {
	start     int64
	progress  int64
	coversOwn bool            // its range holds the own key
	keys      map[string]bool // the keys it covers; nil for the whole queue
}

func (c *coverage) covers(key string) bool { return c.keys == nil || c.keys[key] }

// decision is what the lock does next.
type decision struct {
	kind decisionKind
	rev  int64 // granted: the revision of the grant; read: the lowest revision the read may reflect
}

type decisionKind int

const (
	decideWait    decisionKind = iota // a source will deliver what is missing
	decideRead                        // read a snapshot at rev or later
	decideGranted                     // held since rev
	decideLost                        // the own key is gone: never held
)

func newKnowledge(key string, token, lease int64, blocks func(*mvccpb.KeyValue) bool) *knowledge {
	return &knowledge{key: key, token: token, lease: lease, blocks: blocks, ownTo: token,
		ahead: map[string]int64{}, gone: map[string]int64{}, sources: map[source]*coverage{}}
}

// snapshot takes a read at revision rev: the own key as it was (nil if
// absent) and the keys older than it in the queue. complete says that no
// older key lies past what was read. A snapshot older than the one the
// view rests on adds nothing and is dropped.
func (k *knowledge) snapshot(rev int64, own *mvccpb.KeyValue, older []*mvccpb.KeyValue, complete bool) {
	if rev < k.token || rev < k.base || k.lost {
		return
	}
	if !k.isOwn(own) {
		k.lost = true
		return
	}
	k.ownTo = max(k.ownTo, rev)
	k.base, k.complete, k.deleted = rev, complete, 0
	k.ahead = make(map[string]int64, len(older))
	for _, kv := range older {
		key := string(kv.Key)
		if kv.CreateRevision >= k.token || !k.blocks(kv) {
			continue
		}
		// A deletion seen after this snapshot removes the key it listed:
		// a key of that name made again would be newer than the own key.
		if d := k.gone[key]; d > rev {
			k.deleted = max(k.deleted, d)
			continue
		}
		k.ahead[key] = kv.CreateRevision
	}
	for key, d := range k.gone {
		if d <= rev {
			delete(k.gone, key)
		}
	}
	k.extend()
}

// isOwn tells whether kv, the own key as read, is still this holding.
func (k *knowledge) isOwn(kv *mvccpb.KeyValue) bool {
	return kv != nil && kv.CreateRevision == k.token && kv.Lease == k.lease
}

// up records that src delivers every event of its range from start on
// (events at revisions below start may have gone unseen). keys is the set
// it covers, nil for the whole queue; coversOwn says that holds the own
// key. A source that comes up again starts over.
func (k *knowledge) up(src source, start int64, keys []string, coversOwn bool) {
	c := &coverage{start: start, progress: start - 1, coversOwn: coversOwn}
	if keys != nil {
		c.keys = make(map[string]bool, len(keys))
		for _, key := range keys {
			c.keys[key] = true
		}
	}
	k.sources[src] = c
	k.extend()
}

// down records that src stopped: it vouches for nothing after what it
// delivered.
func (k *knowledge) down(src source) { delete(k.sources, src) }

// events takes one response of src, in revision order, and what it
// vouches for: every event of its range up to progress (at least the last
// event's revision) has been delivered. Events of a source that is not up
// are dropped.
func (k *knowledge) events(src source, evs []*mvccpb.Event, progress int64) {
	c, ok := k.sources[src]
	if !ok {
		return
	}
	for _, ev := range evs {
		k.event(ev)
		progress = max(progress, ev.Kv.ModRevision)
	}
	c.progress = max(c.progress, progress)
	k.extend()
}

// event applies one event, whichever source delivered it.
func (k *knowledge) event(ev *mvccpb.Event) {
	key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
	if key == k.key {
		k.ownEvent(ev)
		return
	}
	if ev.Type != mvccpb.DELETE || rev <= k.base {
		return
	}
	k.gone[key] = max(k.gone[key], rev)
	if _, ok := k.ahead[key]; ok {
		delete(k.ahead, key)
		k.deleted = max(k.deleted, rev)
	}
}

// ownEvent applies an event of the own key: its deletion after the token,
// or a put that made it another holding's (a new creation revision) or
// moved it off the session's lease, ends it.
func (k *knowledge) ownEvent(ev *mvccpb.Event) {
	if ev.Kv.ModRevision <= k.token {
		return // an earlier holding of the same key
	}
	if ev.Type == mvccpb.DELETE || !k.isOwn(ev.Kv) {
		k.lost = true
	}
}

// extend carries ownTo forward through the sources that cover the own key
// with no gap: a source that started no later than the revision after
// ownTo vouches for the own key up to its progress.
func (k *knowledge) extend() {
	for moved := true; moved; {
		moved = false
		for _, c := range k.sources {
			if c.coversOwn && k.contiguous(c.start, k.ownTo) && c.progress > k.ownTo {
				k.ownTo, moved = c.progress, true
			}
		}
	}
}

// contiguous tells whether a source that started at start leaves no gap
// after a knowledge that reaches through rev.
func (k *knowledge) contiguous(start, rev int64) bool {
	if k.seam.ignoresStart() {
		return true
	}
	return start <= rev+1
}

// decide applies the rule to what is known.
func (k *knowledge) decide() decision {
	switch {
	case k.lost:
		return decision{kind: decideLost}
	case k.base == 0 || !k.complete:
		return decision{kind: decideRead, rev: k.readFloor()}
	case len(k.ahead) == 0:
		return k.decideEmpty()
	case k.ownWatched() && k.watched():
		return decision{kind: decideWait}
	}
	// A waiter must hear at once that its own key went, and must hear
	// of the keys ahead going: with no source on either, only a read
	// tells.
	return decision{kind: decideRead, rev: k.readFloor()}
}

// decideEmpty decides once no key ahead is left: granted if the own key
// is known unchanged through the last deletion.
func (k *knowledge) decideEmpty() decision {
	g := max(k.base, k.deleted)
	switch {
	case k.ownTo >= g || k.seam.ignoresOwn():
		return decision{kind: decideGranted, rev: g}
	case k.ownWillReach():
		return decision{kind: decideWait}
	}
	return decision{kind: decideRead, rev: g}
}

// readFloor is the lowest revision a read may reflect and still be of
// use: no older than anything the view relies on having seen, and no older
// than the revision before any source's start, so that every source up
// carries on from it with no gap.
func (k *knowledge) readFloor() int64 {
	floor := max(k.token, k.base, k.deleted)
	for _, d := range k.gone {
		floor = max(floor, d)
	}
	for _, c := range k.sources {
		floor = max(floor, c.start-1)
	}
	return floor
}

// watched tells whether some key ahead is covered, with no gap since the
// snapshot, by a source up: its deletion will be delivered. Keys ahead
// that no source covers change nothing while one that is covered stays.
func (k *knowledge) watched() bool {
	for key := range k.ahead {
		for _, c := range k.sources {
			if c.covers(key) && k.contiguous(c.start, k.base) {
				return true
			}
		}
	}
	return false
}

// ownWatched tells whether a source up covers the own key with no gap
// since what is known of it: a change of the own key will be delivered.
func (k *knowledge) ownWatched() bool {
	for _, c := range k.sources {
		if c.coversOwn && k.contiguous(c.start, k.ownTo) {
			return true
		}
	}
	return false
}

// ownWillReach tells whether a source covering both the own key and the
// keys ahead, with no gap, is up: it delivers the deletion that emptied
// the view in order with any change of the own key before it, so waiting
// for it carries ownTo to the grant.
func (k *knowledge) ownWillReach() bool {
	for _, c := range k.sources {
		if c.coversOwn && c.keys == nil && k.contiguous(c.start, k.ownTo) {
			return true
		}
	}
	return false
}
