package lease

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The explorer drives the grant rule (knowledge) through random orders of
// what a lock can learn about one queue history: events of separate
// watches in no fixed order among them, watches that start late, go down
// and come up again, reads answered by members that lag (at any revision
// the read allows), deletions of several keys in one transaction, foreign
// deletes and puts of the own key. Every decision is checked against an
// oracle of the real queue: a grant at G is valid only if at G the own key
// was this holding and no older key blocked it; a loss only if the own
// key had been lost by then. Once everything is delivered, the rule must
// reach the decision the final queue calls for: it never hangs on a view
// that no source will correct.

const (
	ownLease   = 7
	otherLease = 9
	readerVal  = "r"
)

// history is one queue's writes: every event, in revision order.
type history struct {
	token int64
	end   int64 // the last revision
	own   string
	evs   []*mvccpb.Event
	older []string // keys created before the own key
}

// genHistory makes a random queue: keys ahead (some readers'), the own
// key, then deletions (some of two keys in one transaction), keys behind,
// and now and then a foreign delete or put of the own key.
func genHistory(r *rand.Rand) history {
	h := history{own: "q/own"}
	rev := int64(0)
	live := map[string]bool{}
	put := func(key, val string, lease int64, create int64) {
		rev++
		if create == 0 {
			create = rev
		}
		h.evs = append(h.evs, &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(val),
			CreateRevision: create, ModRevision: rev, Lease: lease}})
		live[key] = true
	}
	for i := range 1 + r.IntN(5) {
		key := fmt.Sprintf("q/a%d", i)
		put(key, map[bool]string{true: readerVal}[r.IntN(3) == 0], otherLease, 0)
		h.older = append(h.older, key)
	}
	// Sessions ahead that released and queued again before the own put:
	// the same names, gone once already.
	for _, key := range h.older {
		if r.IntN(3) == 0 {
			rev++
			h.evs = append(h.evs, &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}})
			put(key, "", otherLease, 0)
		}
	}
	put(h.own, "", ownLease, 0)
	h.token = rev
	for range 2 + r.IntN(10) {
		rev++
		for _, key := range pickDeletions(r, h, live) {
			h.evs = append(h.evs, &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}})
			delete(live, key)
		}
		switch r.IntN(8) {
		case 0:
			put(fmt.Sprintf("q/b%d", rev), "", otherLease, 0) // a key behind
		case 1:
			if live[h.own] && r.IntN(3) == 0 {
				put(h.own, "x", 0, h.token) // a foreign put that drops the lease
			}
		case 3:
			// Someone else's put moves a key ahead off its lease: it
			// stays, but is no lock from then on.
			if key := h.older[r.IntN(len(h.older))]; live[key] && r.IntN(2) == 0 {
				put(key, "x", 0, h.at(rev)[key].CreateRevision)
			}
		case 2:
			// The session of a key ahead that went queues again: a key
			// of the same name, newer than the own one.
			if key := h.older[r.IntN(len(h.older))]; !live[key] {
				put(key, "", otherLease, 0)
			}
		}
	}
	h.end = rev
	return h
}

// pickDeletions chooses the keys one transaction deletes: usually one key
// ahead, sometimes the own key with it or alone, sometimes none.
func pickDeletions(r *rand.Rand, h history, live map[string]bool) []string {
	var ahead []string
	for _, key := range h.older {
		if live[key] {
			ahead = append(ahead, key)
		}
	}
	var keys []string
	if len(ahead) > 0 && r.IntN(4) != 0 {
		keys = append(keys, ahead[r.IntN(len(ahead))])
	}
	if live[h.own] && r.IntN(10) == 0 {
		keys = append(keys, h.own)
	}
	return keys
}

// at is the queue at revision rev: each live key's last put.
func (h history) at(rev int64) map[string]*mvccpb.KeyValue {
	kvs := map[string]*mvccpb.KeyValue{}
	for _, ev := range h.evs {
		if ev.Kv.ModRevision > rev {
			break
		}
		if ev.Type == mvccpb.DELETE {
			delete(kvs, string(ev.Kv.Key))
		} else {
			kvs[string(ev.Kv.Key)] = ev.Kv
		}
	}
	return kvs
}

func isOwnKV(h history, kv *mvccpb.KeyValue) bool {
	return kv != nil && kv.CreateRevision == h.token && kv.Lease == ownLease
}

// granted is the oracle: at rev the own key is this holding and no older
// key blocks it.
func (h history) granted(rev int64, blocks func(*mvccpb.KeyValue) bool) bool {
	kvs := h.at(rev)
	if !isOwnKV(h, kvs[h.own]) {
		return false
	}
	for _, kv := range kvs {
		if kv.CreateRevision < h.token && blocks(kv) {
			return false
		}
	}
	return true
}

// lostBy tells whether the own key was no longer this holding at some
// revision up to rev: once lost, a holding never comes back.
func (h history) lostBy(rev int64) bool {
	for r := h.token; r <= rev; r++ {
		if !isOwnKV(h, h.at(r)[h.own]) {
			return true
		}
	}
	return false
}

// watch is one source of the explorer: a watch of some keys (nil: the
// whole queue) that delivers the history's events of its range from its
// start on, in order.
type watch struct {
	name      string
	src       source // its subscription, as the rule names it
	keys      []string
	coversOwn bool
	// filterPut: the watch delivers deletions only, as a session's queue
	// watch and follow watches do (WithFilterPut).
	filterPut bool
	up        bool
	next      int    // index in the history's events of the next one to deliver
	gen       uint64 // odd while up, as a keyWatch's epoch
	lastStart int64  // where its last generation up started
}

func (w *watch) covers(key string) bool { return w.keys == nil || slices.Contains(w.keys, key) }

// world is one run: the history, the store's current revision, the
// watches, the read the rule asked for, and the rule itself.
type world struct {
	r       *rand.Rand
	h       history
	head    int64
	watches []*watch
	reading bool
	ownOnly bool // the read asked for is of the own key alone
	// tokenLate: the rule is told the token only after a few steps.
	tokenLate bool
	floor     int64
	k         *knowledge
	blocks    func(*mvccpb.KeyValue) bool
	trace     []string
	done      bool
	err       error // the first decision the oracle refused
}

// worldShape says how the explorer's watches are built.
type worldShape struct {
	// queueFiltersPuts: the queue watch delivers deletions only, as a
	// session's queue watch does (watch.go, serve: WithFilterPut), and so
	// does not count as covering the own key (sources.go, sourceOf); a
	// Keeper's, which keeps puts, does.
	queueFiltersPuts bool
}

func newWorldShaped(seed uint64, mutate func(*knowledge), shape worldShape) *world {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := genHistory(r)
	reader := r.IntN(3) == 0
	// A key off its lease (lease 0) is no lock, and blocks nobody.
	blocks := func(kv *mvccpb.KeyValue) bool { return kv.Lease != 0 && (!reader || string(kv.Value) != readerVal) }
	w := &world{r: r, h: h, head: h.token, blocks: blocks}
	w.k = newKnowledge(h.own, func(kv *mvccpb.KeyValue) bool { return isOwnKV(h, kv) }, blocks)
	// Now and then the put's answer comes late: the watches may deliver
	// before the rule knows the token.
	w.tokenLate = r.IntN(4) == 0
	if !w.tokenLate {
		w.k.setToken(h.token)
	}
	if mutate != nil {
		mutate(w.k)
	}
	w.watches = []*watch{{name: "own", keys: []string{h.own}, coversOwn: true}, {name: "queue", coversOwn: !shape.queueFiltersPuts, filterPut: shape.queueFiltersPuts}}
	// A far waiter's follows: the newest keys ahead.
	if n := len(h.older); n > 0 {
		w.watches = append(w.watches, &watch{name: "follow", keys: h.older[max(0, n-2):]})
	}
	if r.IntN(2) == 0 {
		w.watches = slices.Delete(w.watches, 1, 2) // no queue watch: a far waiter's shape
	}
	for _, wt := range w.watches {
		wt.src = w.k.listen(wt.keys, wt.coversOwn)
	}
	// A watch the lock subscribed to before its put (kept by its session
	// across locks) delivers from a revision before the token.
	if r.IntN(2) == 0 {
		wt := w.watches[len(w.watches)-1]
		w.upAt(wt, 1+r.Int64N(h.token))
	}
	// The enqueue's read: a snapshot at the token, as the put returns it.
	if r.IntN(2) == 0 {
		w.answer(h.token)
	} else {
		w.reading, w.floor = true, h.token
	}
	return w
}

func (w *world) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

// step does one random thing the world allows.
func (w *world) step() {
	if w.tokenLate && w.r.IntN(4) == 0 {
		w.tokenLate = false
		w.k.setToken(w.h.token)
		w.logf("the put returns: token %d", w.h.token)
	}
	switch n := w.r.IntN(10); {
	case n < 2 && w.head < w.h.end:
		w.head++
		w.logf("head %d", w.head)
	case n < 5:
		w.deliver(w.watches[w.r.IntN(len(w.watches))], false)
	case n < 7 && w.reading && w.floor <= w.head:
		rev := w.floor + w.r.Int64N(w.head-w.floor+1) // any member at or past the floor
		if w.ownOnly {
			w.answerOwn(rev)
		} else {
			w.answer(rev)
		}
	case n == 7:
		w.toggle(w.watches[w.r.IntN(len(w.watches))])
	case n == 8:
		w.lateUp(w.watches[w.r.IntN(len(w.watches))])
	case n == 9 && w.head > w.h.token:
		w.readFollowed(w.h.token + w.r.Int64N(w.head-w.h.token+1))
	}
	w.check()
}

// toggle brings a watch up (it starts at the revision after the head, as
// a watch opened at the current revision does) or down.
func (w *world) toggle(wt *watch) {
	if wt.up {
		wt.gen++
		wt.up = false
		w.k.down(wt.src, wt.gen)
		w.logf("%s down", wt.name)
		return
	}
	w.upAt(wt, w.head+1)
}

// upAt brings a watch up, delivering every event of its range from start on.
func (w *world) upAt(wt *watch, start int64) {
	wt.gen++
	wt.up = true
	wt.next = slices.IndexFunc(w.h.evs, func(ev *mvccpb.Event) bool { return ev.Kv.ModRevision >= start })
	if wt.next < 0 {
		wt.next = len(w.h.evs)
	}
	wt.lastStart = start
	w.k.up(wt.src, wt.gen, start)
	w.logf("%s up at %d", wt.name, start)
}

// lateUp hands the rule, again, the news that a watch now down came up in
// its last generation: news that arrives after the watch went down (the
// watch reports it on its goroutine as a lock subscribes on another). The
// rule must not count on a watch that delivers nothing more.
func (w *world) lateUp(wt *watch) {
	if wt.up || wt.gen == 0 {
		return
	}
	w.k.up(wt.src, wt.gen-1, wt.lastStart)
	w.logf("%s late news: up in generation %d", wt.name, wt.gen-1)
}

// deliver sends a watch's next response: the events of its range in the
// next few revisions up to the head (all of them with all set).
func (w *world) deliver(wt *watch, all bool) {
	if !wt.up {
		return
	}
	var evs []*mvccpb.Event
	revs := 1 + w.r.IntN(3)
	last := int64(0)
	for ; wt.next < len(w.h.evs); wt.next++ {
		ev := w.h.evs[wt.next]
		rev := ev.Kv.ModRevision
		if rev > w.head || (rev != last && revs == 0 && !all) {
			break
		}
		if rev != last {
			revs--
			last = rev
		}
		if wt.covers(string(ev.Kv.Key)) && !(wt.filterPut && ev.Type == mvccpb.PUT) {
			evs = append(evs, ev)
		}
	}
	if len(evs) > 0 {
		w.k.events(wt.src, wt.gen, evs, 0)
		w.logf("%s delivers %d events through %d", wt.name, len(evs), evs[len(evs)-1].Kv.ModRevision)
	}
}

// answer reads the queue at rev, as a member that has applied rev does:
// every key older than the own one, or, as a page of a long queue, only
// the two newest of them.
func (w *world) answer(rev int64) {
	kvs := w.h.at(rev)
	var older []*mvccpb.KeyValue
	for _, kv := range kvs {
		if kv.CreateRevision < w.h.token && w.blocks(kv) { // the lock lists only keys that block it
			older = append(older, kv)
		}
	}
	slices.SortFunc(older, func(a, b *mvccpb.KeyValue) int { return int(b.CreateRevision - a.CreateRevision) })
	complete := true
	if len(older) > 2 && w.r.IntN(3) == 0 {
		older, complete = older[:2], false
	}
	w.reading = false
	w.k.snapshot(rev, kvs[w.h.own], older, complete)
	w.logf("read at %d (complete %v)", rev, complete)
}

// answerOwn reads the own key alone at rev.
func (w *world) answerOwn(rev int64) {
	w.reading = false
	w.k.ownRead(rev, w.h.at(rev)[w.h.own])
	w.logf("read the own key at %d", rev)
}

// readFollowed reads the keys a far waiter follows, at rev, as its
// follow does once their watches are up: each one there (with the
// creation revision it had) or gone.
func (w *world) readFollowed(rev int64) {
	kvs := w.h.at(rev)
	n := len(w.h.older)
	for _, key := range w.h.older[max(0, n-2):] {
		if kv := kvs[key]; kv != nil && kv.CreateRevision < w.h.token && w.blocks(kv) {
			w.k.confirm(kv, rev)
		} else {
			w.k.goneBy(key, rev)
		}
	}
	w.logf("read the followed keys at %d", rev)
}

// check holds every decision to the oracle.
func (w *world) check() {
	if w.done {
		return
	}
	d := w.k.decide()
	switch d.kind {
	case decideGranted:
		if d.rev > w.head || !w.h.granted(d.rev, w.blocks) {
			w.fail("granted at %d (head %d), which the queue does not allow", d.rev, w.head)
		}
		w.done = true
	case decideLost:
		if !w.h.lostBy(w.head) {
			w.fail("lost while the own key is still held at %d", w.head)
		}
		w.done = true
	case decideRead, decideReadOwn:
		if !w.reading {
			w.reading, w.ownOnly, w.floor = true, d.kind == decideReadOwn, d.rev
			w.logf("asks a read at %d or later (own key only: %v)", d.rev, w.ownOnly)
		}
	}
}

// finish delivers everything and answers every read at the last revision:
// the rule must then decide as the final queue says.
func (w *world) finish() {
	w.head = w.h.end
	if w.tokenLate {
		w.tokenLate = false
		w.k.setToken(w.h.token)
	}
	for range 4 {
		for _, wt := range w.watches {
			w.deliver(wt, true)
		}
		if w.reading && w.ownOnly {
			w.answerOwn(w.head)
		} else if w.reading {
			w.answer(w.head)
		}
		w.check()
	}
	if w.done {
		return
	}
	w.done = true
	switch {
	case w.h.lostBy(w.h.end):
		w.fail("never learned that its key was lost")
	case w.h.granted(w.h.end, w.blocks):
		w.fail("hangs: the queue grants it at %d, and the rule says %+v", w.h.end, w.k.decide())
	}
}

func (w *world) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("%s\nhistory: %s\ntrace:\n  %s", fmt.Sprintf(format, args...), w.h, joinLines(w.trace))
	}
	w.done = true
}

func (h history) String() string {
	s := fmt.Sprintf("token %d;", h.token)
	for _, ev := range h.evs {
		s += fmt.Sprintf(" %s %s@%d(c%d,l%d)", ev.Type, ev.Kv.Key, ev.Kv.ModRevision, ev.Kv.CreateRevision, ev.Kv.Lease)
	}
	return s
}

func joinLines(lines []string) string {
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// outcomes counts how the explorer's runs ended.
type outcomes struct{ granted, lost, waiting int }

// explore runs the explorer over seeds, each with a step budget, and
// returns the first failure, which names its seed.
func explore(seeds, steps int, mutate func(*knowledge)) (outcomes, error) {
	return exploreShaped(seeds, steps, mutate, worldShape{})
}

// exploreShaped is explore with watches built as shape says.
func exploreShaped(seeds, steps int, mutate func(*knowledge), shape worldShape) (outcomes, error) {
	var o outcomes
	for seed := range uint64(seeds) {
		w := newWorldShaped(seed, mutate, shape)
		w.logf("seed %d", seed)
		w.check()
		for i := 0; i < steps && !w.done; i++ {
			w.step()
		}
		if w.err == nil {
			w.finish()
		}
		if w.err != nil {
			return o, w.err
		}
		switch d := w.k.decide(); d.kind {
		case decideGranted:
			o.granted++
		case decideLost:
			o.lost++
		default:
			o.waiting++
		}
	}
	return o, nil
}

func TestGrantRuleExplorer(t *testing.T) {
	seeds := 20000
	if testing.Short() {
		seeds = 2000
	}
	o, err := explore(seeds, 60, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs: %d granted, %d lost, %d still waiting at the end", seeds, o.granted, o.lost, o.waiting)
	// The histories must exercise every outcome, or the checks above
	// checked nothing.
	if o.granted < seeds/10 || o.lost < seeds/20 || o.waiting < seeds/20 {
		t.Fatalf("outcomes too uneven to trust: %+v", o)
	}
}

// TestGrantRuleOwnKeyBeforeToken: a watch may deliver the own key's
// deletion before the put's answer tells the lock its token. The rule
// must still count it once the token is known, however far the watch's
// progress carries the own key.
func TestGrantRuleOwnKeyBeforeToken(t *testing.T) {
	const token = 5
	own := &mvccpb.KeyValue{Key: []byte("q/own"), CreateRevision: token, ModRevision: token, Lease: ownLease}
	k := newKnowledge("q/own", func(kv *mvccpb.KeyValue) bool {
		return kv != nil && kv.CreateRevision == token && kv.Lease == ownLease
	}, func(*mvccpb.KeyValue) bool { return true })
	src := k.listen([]string{"q/own"}, true)
	k.up(src, 1, token)
	k.events(src, 1, []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("q/own"), ModRevision: token + 2}}}, token+3)
	k.setToken(token)
	k.snapshot(token, own, nil, true)
	if d := k.decide(); d.kind != decideLost {
		t.Fatalf("own key deleted at %d, before the token was known: the rule says %+v, want lost", token+2, d)
	}
}

// TestGrantRuleExplorerQueueWatchDeletesOnly runs the explorer with a
// queue watch that delivers deletions only (WithFilterPut, as a session's
// once was opened). A
// foreign put that moves the own key off the lease then reaches the rule
// only through the own-key watch, in no fixed order with the queue
// watch's deletions, so the queue watch must not vouch for the own key
// (counted as covering it, the rule granted after such a put: seed 1944).
func TestGrantRuleExplorerQueueWatchDeletesOnly(t *testing.T) {
	seeds := 20000
	if testing.Short() {
		seeds = 2000
	}
	o, err := exploreShaped(seeds, 60, nil, worldShape{queueFiltersPuts: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs: %d granted, %d lost, %d still waiting at the end", seeds, o.granted, o.lost, o.waiting)
}

// TestGrantRuleNameGoneTwiceBeforeSnapshot: a session ahead released
// (its key gone at 3), queued again (created 4), and its new key went too
// (at 7); both deletions arrive before the enqueue's read at 6, which
// lists the new key. The second deletion, after the read, must count: the
// rule once kept only the lowest revision a name went at, and waited for
// ever (seen as four waiters stalled in the handoff benchmark).
func TestGrantRuleNameGoneTwiceBeforeSnapshot(t *testing.T) {
	const token = 6
	own := &mvccpb.KeyValue{Key: []byte("q/own"), CreateRevision: token, ModRevision: token, Lease: ownLease}
	k := newKnowledge("q/own", func(kv *mvccpb.KeyValue) bool {
		return kv != nil && kv.CreateRevision == token && kv.Lease == ownLease
	}, func(*mvccpb.KeyValue) bool { return true })
	src := k.listen(nil, true)
	k.up(src, 1, 1)
	del := func(rev int64) *mvccpb.Event {
		return &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("q/a"), ModRevision: rev}}
	}
	k.events(src, 1, []*mvccpb.Event{del(3)}, 0)
	k.events(src, 1, []*mvccpb.Event{del(7)}, 0)
	k.setToken(token)
	k.snapshot(token, own, []*mvccpb.KeyValue{{Key: []byte("q/a"), CreateRevision: 4}}, true)
	if d := k.decide(); d.kind != decideGranted || d.rev != 7 {
		t.Fatalf("the key ahead went at 7, after the read at %d: the rule says %+v, want granted at 7", token, d)
	}
}
