package lease

import (
	"cmp"
	"slices"

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
	token int64 // the own key's creation revision; 0 until the put returns
	// owns tells whether a read of the own key shows this holding (its
	// token, the session's lease).
	owns func(kv *mvccpb.KeyValue) bool

	base     int64                // revision of the snapshot the view rests on; 0 before the first
	complete bool                 // ... which listed every blocking key older than the own key
	ahead    map[string]*keyAhead // blocking keys listed by it, not yet seen deleted
	// removed are the keys the snapshot listed that have been seen gone
	// since, each with the lowest revision by which it is known gone (the
	// revision of its delete event, or of a read that no longer found it).
	removed map[string]int64
	// gone is, by key, every revision at which a key was seen gone (a
	// delete event, or a read that no longer found it), ascending: a
	// later snapshot counts the first one after it for a key it lists. A
	// key's name comes back (its session queues again), so a name may go
	// more than once, and events may arrive before the snapshot they
	// follow.
	gone    map[string][]int64
	ownTo   int64 // the own key is known unchanged from the token through this revision
	sources map[source]*coverage
	// over says, for each source, that its generations below this one
	// are over: the news that a generation came up may arrive after the
	// news that it went down (a watch reports both on its goroutine while
	// the lock subscribes on another), and must not bring it back.
	over map[source]uint64
	lost bool // the own key was deleted or taken over: never granted
	// early holds the own key's events that came before its token was
	// known (a watch may deliver a change of the key before the put's
	// answer arrives): setToken applies them.
	early []*mvccpb.Event
	seam  grantSeam
}

// keyAhead is a blocking key the snapshot listed.
type keyAhead struct {
	created int64 // its creation revision
	// kv is the key as last read. The rule needs only its creation
	// revision; the lock reads the rest (a reader's or a writer's) to
	// choose how to wait.
	kv *mvccpb.KeyValue
	// through is the highest revision at which it is known to be there
	// still: the snapshot's, or a later read's (confirm).
	through int64
}

// source names where a fact came from: the own key's watch, the queue
// watch, a watch of one key ahead, a copy of the queue.
type source string

// coverage is what one source delivers: every event of its range from
// start on, in revision order, up to progress.
type coverage struct {
	gen       uint64
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
	decideReadOwn                     // read the own key at rev or later
	decideGranted                     // held since rev
	decideLost                        // the own key is gone: never held
)

func newKnowledge(key string, owns func(*mvccpb.KeyValue) bool) *knowledge {
	return &knowledge{key: key, owns: owns,
		ahead: map[string]*keyAhead{}, removed: map[string]int64{}, gone: map[string][]int64{}, sources: map[source]*coverage{}, over: map[source]uint64{}}
}

// setToken records the own key's creation revision, as its put returns:
// the own key is known to be this holding at it.
func (k *knowledge) setToken(token int64) {
	k.token, k.ownTo = token, max(k.ownTo, token)
	for _, ev := range k.early {
		k.ownEvent(ev)
	}
	k.early = nil
	k.extend()
}

// ownRead takes a read of the own key alone at rev; kv is what it showed
// (nil if absent). Found with its token, the key has lasted from the
// token to rev: a key deleted and made again has a new creation revision.
func (k *knowledge) ownRead(rev int64, kv *mvccpb.KeyValue) {
	if k.token == 0 || rev < k.token || k.lost {
		return
	}
	if !k.owns(kv) {
		k.lost = true
		return
	}
	k.ownTo = max(k.ownTo, rev)
	k.extend()
}

// snapshot takes a read at revision rev: the own key as it was (nil if
// absent) and the keys older than it in the queue that block it. complete
// says that no older key lies past what was read. A snapshot older than the one the
// view rests on adds nothing and is dropped.
func (k *knowledge) snapshot(rev int64, own *mvccpb.KeyValue, older []*mvccpb.KeyValue, complete bool) {
	if k.token == 0 || rev < k.token || rev < k.base || k.lost {
		return
	}
	if !k.owns(own) {
		k.lost = true
		return
	}
	k.ownTo = max(k.ownTo, rev)
	k.base, k.complete = rev, complete
	k.removed = map[string]int64{}
	k.ahead = make(map[string]*keyAhead, len(older))
	for _, kv := range older {
		key := string(kv.Key)
		if kv.CreateRevision >= k.token {
			continue
		}
		// A deletion seen after this snapshot removes the key it listed:
		// a key of that name made again would be newer than the own key.
		if d, ok := k.goneAfter(key, rev); ok {
			k.removed[key] = d
			continue
		}
		k.ahead[key] = &keyAhead{created: kv.CreateRevision, through: rev, kv: kv}
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
func (k *knowledge) goneAfter(key string, rev int64) (int64, bool) {
	ds := k.gone[key]
	i, _ := slices.BinarySearch(ds, rev+1)
	if i == len(ds) {
		return 0, false
	}
	return ds[i], true
}

// clear drops key from the keys ahead: a read showed it, with the
// creation revision the snapshot listed, to be no key that blocks the
// lock (a keys-only read lists every key under the name). A key's kind is
// fixed when it is made (its lease and its value are put with it), so it
// never blocked.
func (k *knowledge) clear(key string, created int64) {
	if a := k.ahead[key]; a != nil && a.created == created {
		delete(k.ahead, key)
	}
}

// confirm takes a read at rev of one key ahead, kv, which showed it
// there with the creation revision the snapshot listed: a watch of it
// that started no later than the revision after rev delivers its
// deletion.
func (k *knowledge) confirm(kv *mvccpb.KeyValue, rev int64) {
	if a := k.ahead[string(kv.Key)]; a != nil && a.created == kv.CreateRevision {
		a.through, a.kv = max(a.through, rev), kv
	}
}

// keysAhead returns the keys ahead, as last read, newest first.
func (k *knowledge) keysAhead() []*mvccpb.KeyValue {
	kvs := make([]*mvccpb.KeyValue, 0, len(k.ahead))
	for _, a := range k.ahead {
		kvs = append(kvs, a.kv)
	}
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(b.CreateRevision, a.CreateRevision) })
	return kvs
}

// goneBy takes a read at rev of one key ahead, which showed it gone (or
// made again, newer than the own key): it was deleted at rev or before,
// which counts as a deletion at rev.
func (k *knowledge) goneBy(key string, rev int64) { k.sawGone(key, rev) }

// sawGone records that key is gone by rev. The first deletion after the
// snapshot is of the key it listed (any later one is of a key made again,
// newer than the own one), so the lowest revision known after the
// snapshot counts: a delete event may come after a read that found the
// key gone, and lowers the revision a grant rests on.
func (k *knowledge) sawGone(key string, rev int64) {
	if rev <= k.base {
		return
	}
	ds := k.gone[key]
	if i, found := slices.BinarySearch(ds, rev); !found {
		k.gone[key] = slices.Insert(ds, i, rev)
	}
	if _, ok := k.ahead[key]; ok {
		delete(k.ahead, key)
		k.removed[key] = rev
	} else if d, ok := k.removed[key]; ok && rev < d {
		k.removed[key] = rev
	}
}

// deleted is the revision by which every key the snapshot listed and
// that has gone since is known gone.
func (k *knowledge) deleted() int64 {
	var d int64
	for _, r := range k.removed {
		d = max(d, r)
	}
	return d
}

// up records that src, in generation gen, delivers every event of its
// range from start on (events at revisions below start may have gone
// unseen). keys is the set it covers, nil for the whole queue; coversOwn
// says that holds the own key. A source that comes up again, in a newer
// generation, starts over; news of an older generation is dropped, and so
// is a second up of the one that is up.
func (k *knowledge) up(src source, gen uint64, start int64, keys []string, coversOwn bool) {
	if c := k.sources[src]; gen < k.over[src] || (c != nil && c.gen >= gen) {
		return
	}
	c := &coverage{gen: gen, start: start, progress: start - 1, coversOwn: coversOwn}
	if keys != nil {
		c.keys = make(map[string]bool, len(keys))
		for _, key := range keys {
			c.keys[key] = true
		}
	}
	k.sources[src] = c
	k.extend()
}

// down records that src stopped in generation gen (any generation up to
// gen is over): it vouches for nothing after what it delivered.
func (k *knowledge) down(src source, gen uint64) {
	if c := k.sources[src]; c != nil && c.gen <= gen {
		delete(k.sources, src)
	}
	k.over[src] = max(k.over[src], gen+1)
}

// events takes one response of src in generation gen, in revision
// order, and what it vouches for: every event of its range up to progress
// (at least the last event's revision) has been delivered. Each event is
// a fact whatever delivered it, and is applied; only a source that is up
// in that generation vouches for what it did not deliver.
func (k *knowledge) events(src source, gen uint64, evs []*mvccpb.Event, progress int64) {
	for _, ev := range evs {
		k.event(ev)
		progress = max(progress, ev.Kv.ModRevision)
	}
	if c, ok := k.sources[src]; ok && c.gen == gen {
		c.progress = max(c.progress, progress)
		k.extend()
	}
}

// event applies one event, whichever source delivered it.
func (k *knowledge) event(ev *mvccpb.Event) {
	key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
	if key == k.key {
		k.ownEvent(ev)
		return
	}
	if ev.Type == mvccpb.DELETE {
		k.sawGone(key, rev)
	}
}

// ownEvent applies an event of the own key: its deletion after the token,
// or a put that made it another holding's (a new creation revision) or
// moved it off the session's lease, ends it.
func (k *knowledge) ownEvent(ev *mvccpb.Event) {
	if k.token == 0 {
		k.early = append(k.early, ev)
		return
	}
	if ev.Kv.ModRevision <= k.token {
		return // an earlier holding of the same key
	}
	after := ev.Kv // the key as the event left it: nil once deleted
	if ev.Type == mvccpb.DELETE {
		after = nil
	}
	if !k.owns(after) {
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
	case k.base == 0 || (len(k.ahead) == 0 && !k.complete):
		// Unread, or every key a partial snapshot listed is gone:
		// older ones may lie past what it read.
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
	g := max(k.base, k.deleted())
	switch {
	case k.ownTo >= g || k.seam.ignoresOwn():
		return decision{kind: decideGranted, rev: g}
	case k.ownWillReach():
		return decision{kind: decideWait}
	}
	return decision{kind: decideReadOwn, rev: g}
}

// readFloor is the lowest revision a read may reflect and still be of
// use: no older than anything the view relies on having seen, and no older
// than the revision before any source's start, so that every source up
// carries on from it with no gap.
func (k *knowledge) readFloor() int64 {
	floor := max(k.token, k.base, k.deleted())
	for _, ds := range k.gone {
		floor = max(floor, ds[len(ds)-1])
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
	for key, a := range k.ahead {
		for _, c := range k.sources {
			if c.covers(key) && k.contiguous(c.start, a.through) {
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
