package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The step explorer drives a real Waiter, as package lease does: at each
// look it asks Next for the lock's step and carries it out against a
// world of the same histories as the rule's explorer (rule_explore_test.go).
// It waits for news, opens and pauses watches, reads the own key, the
// view or the followed keys at any revision the read allows (a member
// that lags), and hands the answer back through the waiter's own methods
// (Read, Page, Relist, Followed, ConfirmedOwn). Meanwhile the world moves
// its head, delivers watch responses and pauses or restarts watches.
//
// Three checks: every grant and loss against the oracle of the real
// queue; step soundness, every step the waiter hands out can be carried
// out (a follow has keys to follow, a read a floor the history reaches);
// and step liveness, once everything is delivered and every read answered
// at the end of the history, the waiter reaches held or lost within
// stepBound looks if the queue grants it or has lost its key. Two more
// hold it to how it is meant to wait (docs/design.md), which costs
// requests, not safety: once a key it follows goes, a far waiter reads
// its view again before it follows anew; and a view read again that shows
// few enough ahead makes it near.

// stepBound is how many looks a waiter may take, once everything is
// delivered, before it must be held or lost.
const stepBound = 12

// readKind is what a pending read reads.
type readKind int

const (
	readOwn     readKind = iota // the own key (StepReadOwn)
	readConfirm                 // the own key, once the own-key watch is up (StepConfirmOwn)
	readView                    // the view with the own key (StepRead, StepReadNear)
	readFar                     // the view again after a followed key went (StepRereadFar)
	readFollow                  // the followed keys (StepFollow)
)

// pendingRead is the read a step started, which the world answers at a
// later step at any revision from floor to the head.
type pendingRead struct {
	kind     readKind
	floor    int64
	keys     []string         // readFollow: the keys read
	epochs   map[string]Epoch // readFollow: their watch's epoch once up
	ownEpoch Epoch            // readConfirm: the own-key watch's epoch once up
}

type stepWorld struct {
	r       *rand.Rand
	h       history
	seed    uint64
	head    int64
	q       Waiter
	own     *watch
	queue   *watch
	follow  *watch // the watch of the keys a far waiter follows; nil until it follows
	pending *pendingRead
	blocks  func(*mvccpb.KeyValue) bool
	trace   []string
	done    bool
	err     error
	steps   map[StepKind]int
	// reread: a far waiter's view was just read again (readFar).
	reread bool
}

func newStepWorld(seed uint64, mutate func(*Waiter)) *stepWorld {
	r := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc909))
	h := genHistory(r, true)
	reader := r.IntN(3) == 0
	blocks := func(kv *mvccpb.KeyValue) bool { return kv.Lease != 0 && (!reader || string(kv.Value) != readerVal) }
	w := &stepWorld{r: r, h: h, seed: seed, head: h.token, blocks: blocks, steps: map[StepKind]int{}}
	owns := func(kv *mvccpb.KeyValue) bool { return isOwnKV(h, kv) }
	w.q = NewWaiter(NewRule(h.own, owns, blocks), Config{
		// Near 1 now and then, so that waiters with few keys ahead are far.
		Near: 1 + 2*r.IntN(2), Follow: 2,
		IsReader:   func(kv *mvccpb.KeyValue) bool { return string(kv.Value) == readerVal },
		IsQueueKey: func(kv *mvccpb.KeyValue) bool { return strings.HasPrefix(string(kv.Key), "q/") && kv.Lease != 0 },
		IsChild:    func(kv *mvccpb.KeyValue) bool { return strings.HasPrefix(string(kv.Key), "q/") },
	})
	if mutate != nil {
		mutate(&w.q)
	}
	w.own = &watch{name: "own", keys: []string{h.own}, coversOwn: true}
	w.queue = &watch{name: "queue", coversOwn: true}
	// The session's watches may be up from before the put.
	for _, wt := range []*watch{w.own, w.queue} {
		if r.IntN(2) == 0 {
			w.upAt(wt, 1+r.Int64N(h.token))
		}
		w.q.Subscribe(wt, false)
	}
	w.q.Read(w.own.gen, w.queue.gen, nil, 0)
	w.q.SetToken(h.token)
	// The put's answer holds a page of the keys ahead, or the lock reads.
	if r.IntN(2) == 0 {
		w.page(h.token)
	}
	return w
}

func (w *stepWorld) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

func (w *stepWorld) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("seed %d: %s\n  history: %v\n  trace:\n%s", w.seed, fmt.Sprintf(format, args...), w.h, joinLines(w.trace))
	}
	w.done = true
}

// now is the watches as the lock looks.
func (w *stepWorld) now() Now {
	return Now{Own: w.own.gen, Queue: w.queue.gen, Follow: func(key string) (Epoch, bool) {
		if w.follow == nil || !slices.Contains(w.follow.keys, key) {
			return 0, false
		}
		return w.follow.gen, true
	}}
}

// upAt brings wt up with everything of its range from start on; the
// lock's subscription to it, if any, is told.
func (w *stepWorld) upAt(wt *watch, start int64) {
	wt.comeUp(w.h, start)
	if wt.sub != nil {
		w.q.Rule.Up(wt.sub.src, wt.gen, start)
	}
	w.logf("%s up at %d (epoch %d)", wt.name, start, wt.gen)
}

// ensureUp opens wt if it is down, as watch.Watch.UpEpoch does: at the
// head+1.
func (w *stepWorld) ensureUp(wt *watch) {
	if !wt.up {
		w.upAt(wt, w.head+1)
	}
}

func (w *stepWorld) down(wt *watch) {
	if !wt.up {
		return
	}
	wt.gen++
	wt.up = false
	if wt.sub != nil {
		w.q.Rule.Down(wt.sub.src, wt.gen)
	}
	w.logf("%s down", wt.name)
}

// deliver has wt hand on its next response (all of it up to the head with
// all set).
func (w *stepWorld) deliver(wt *watch, all bool) {
	evs, ok := wt.handOn(w.r, w.h, w.head, all)
	if !ok {
		return
	}
	if wt.sub != nil && len(evs) > 0 {
		w.q.Rule.Events(wt.sub.src, wt.gen, evs, 0)
		w.logf("%s delivers %d events through %d", wt.name, len(evs), evs[len(evs)-1].Kv.ModRevision)
	}
}

// step does one random thing the world allows, and the lock looks.
func (w *stepWorld) step() {
	switch n := w.r.IntN(10); {
	case n < 2 && w.head < w.h.end:
		w.head++
	case n < 5:
		w.deliver([]*watch{w.own, w.queue, w.follow}[w.r.IntN(3)], false)
	case n < 8:
		w.answer(false)
	case n == 8:
		wt := []*watch{w.own, w.queue}[w.r.IntN(2)]
		if wt.up {
			w.down(wt)
		} else {
			w.upAt(wt, w.head+1)
		}
	}
	w.look()
}

// look is the lock asking its waiter for the next step and carrying it
// out: a grant or loss is held to the oracle; a read is started, to be
// answered later.
func (w *stepWorld) look() {
	// The lock carries out one step at a time: while its read is out it
	// does not look (events still reach its rule meanwhile).
	if w.done || w.pending != nil {
		return
	}
	near := w.q.Rule.Complete() && (w.q.Rule.AheadCount()+w.q.sharing <= w.q.cfg.Near || w.q.onlyReadersAhead())
	went := w.q.far && w.q.Rule.AheadCount() < w.q.listed
	st := w.q.Next(w.now(), false, false)
	w.steps[st.Kind]++
	switch {
	case st.Kind == StepFollow && went:
		w.fail("follows anew after a key it followed went, without reading its view again")
	case w.reread && near && st.PauseQueue:
		w.fail("stays far after a view read again showed %d ahead (near: %d)", w.q.Rule.AheadCount(), w.q.cfg.Near)
	}
	w.reread = false
	if st.PauseQueue {
		w.down(w.queue)
	}
	w.carryOut(st)
}

// carryOut carries out step st: a grant or loss is held to the oracle and
// ends the run; a read is started.
func (w *stepWorld) carryOut(st Step) {
	switch st.Kind {
	case StepHeld:
		d := w.q.Rule.Decide()
		if d.Rev > w.head || !w.h.granted(d.Rev, w.blocks) {
			w.fail("granted at %d (head %d), which the queue does not allow", d.Rev, w.head)
		}
		w.done = true
	case StepLost:
		if !w.h.lostBy(w.head) {
			w.fail("lost while the own key is still held at %d", w.head)
		}
		w.done = true
	case StepWait, StepLocked:
	default:
		w.start(st)
	}
}

// start carries out a read step up to sending the read: it opens the
// watches the step needs and records what the read is under.
func (w *stepWorld) start(st Step) {
	if st.MinRev > w.h.end {
		w.fail("step %+v cannot be carried out: its floor is past the history's end %d", st, w.h.end)
		return
	}
	p := &pendingRead{floor: max(st.MinRev, w.h.token)}
	switch st.Kind {
	case StepReadOwn:
		p.kind = readOwn
	case StepConfirmOwn:
		w.ensureUp(w.own)
		p.kind, p.ownEpoch, p.floor = readConfirm, w.own.gen, max(w.own.lastStart-1, w.h.token)
	case StepFollow:
		if !w.startFollow(p) {
			return
		}
	case StepRereadFar, StepReadNear, StepRead:
		p.kind = readView
		if st.Kind == StepRereadFar {
			w.q.FarDone()
			p.kind = readFar
		}
		if st.Kind != StepRead {
			w.ensureUp(w.queue)
		}
		w.ensureUp(w.own)
		seen := w.own.seen
		if w.queue.up {
			seen = max(seen, w.queue.seen)
		}
		var follows map[string]Epoch
		if w.follow != nil {
			follows = map[string]Epoch{}
			for _, k := range w.follow.keys {
				follows[k] = w.follow.gen
			}
		}
		p.floor = max(p.floor, w.q.Read(w.own.gen, w.queue.gen, follows, seen))
	}
	w.pending = p
	w.logf("step %d: read %d from %d", st.Kind, p.kind, p.floor)
}

// startFollow opens a watch of the keys the waiter follows (replacing one
// of other keys, as a session's follows cache does) and, once it is up,
// starts their read. false: the step cannot be carried out.
func (w *stepWorld) startFollow(p *pendingRead) bool {
	keys := w.q.FollowKeys()
	if len(keys) == 0 {
		w.fail("step Follow cannot be carried out: no key to follow")
		return false
	}
	if w.follow == nil || !slices.Equal(w.follow.keys, keys) {
		if w.follow != nil {
			w.q.Unsubscribe(w.follow)
		}
		w.follow = &watch{name: "follow", keys: keys}
		w.q.Subscribe(w.follow, false)
	}
	w.ensureUp(w.follow)
	p.kind, p.keys = readFollow, keys
	p.epochs = map[string]Epoch{}
	for _, k := range keys {
		p.epochs[k] = w.follow.gen
	}
	p.floor = max(p.floor, w.q.FollowFloor(keys), w.follow.lastStart-1)
	return true
}

// answer answers the pending read at a revision from its floor to the
// head (the head itself with atHead).
func (w *stepWorld) answer(atHead bool) {
	p := w.pending
	if p == nil || p.floor > w.head {
		return
	}
	rev := w.head
	if !atHead {
		rev = p.floor + w.r.Int64N(w.head-p.floor+1)
	}
	w.pending = nil
	kvs := w.h.at(rev)
	switch p.kind {
	case readOwn, readConfirm:
		w.q.Rule.OwnRead(rev, kvs[w.h.own])
		if p.kind == readConfirm && !w.q.Rule.Lost() {
			w.q.ConfirmedOwn(p.ownEpoch)
		}
	case readFollow:
		read := make([]*mvccpb.KeyValue, len(p.keys))
		for i, k := range p.keys {
			read[i] = kvs[k]
		}
		w.q.Followed(rev, p.keys, read, p.epochs)
	case readView, readFar:
		if !isOwnKV(w.h, kvs[w.h.own]) {
			w.q.Rule.OwnRead(rev, kvs[w.h.own]) // readWithOwn: the key is gone
			break
		}
		w.reread = p.kind == readFar
		if p.kind == readFar && w.r.IntN(2) == 0 && w.q.Relist(rev, w.ownKV(), w.olderAt(kvs)) {
			break
		}
		w.page(rev)
	}
	w.logf("answered at %d", rev)
}

// page is a read of the view at rev: the keys older than the own one,
// newest first, a page of two of them now and then.
func (w *stepWorld) page(rev int64) {
	older := w.olderAt(w.h.at(rev))
	more := false
	if len(older) > 2 && w.r.IntN(3) == 0 {
		older, more = older[:2], true
	}
	w.q.Page(rev, w.ownKV(), older, more)
}

func (w *stepWorld) ownKV() *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(w.h.own), CreateRevision: w.h.token, ModRevision: w.h.token, Lease: ownLease}
}

// olderAt lists the keys under the name older than the own key in kvs,
// newest first, as a read of the view does.
func (w *stepWorld) olderAt(kvs map[string]*mvccpb.KeyValue) []*mvccpb.KeyValue {
	var older []*mvccpb.KeyValue
	for _, kv := range kvs {
		if kv.CreateRevision < w.h.token {
			older = append(older, kv)
		}
	}
	slices.SortFunc(older, func(a, b *mvccpb.KeyValue) int { return int(b.CreateRevision - a.CreateRevision) })
	return older
}

// finish delivers everything and answers every read at the end of the
// history, and checks step liveness.
func (w *stepWorld) finish() {
	w.head = w.h.end
	for range stepBound {
		if w.done {
			return
		}
		for _, wt := range []*watch{w.own, w.queue, w.follow} {
			w.deliver(wt, true)
		}
		w.answer(true)
		w.look()
	}
	if w.done {
		return
	}
	switch {
	case w.h.lostBy(w.h.end):
		w.fail("never learned that its key was lost within %d looks", stepBound)
	case w.h.granted(w.h.end, w.blocks):
		w.fail("not granted within %d looks of everything delivered, though the queue grants it", stepBound)
	}
}

func runSteps(seed uint64, looks int, mutate func(*Waiter)) *stepWorld {
	w := newStepWorld(seed, mutate)
	for range looks {
		if w.done {
			break
		}
		w.step()
	}
	w.finish()
	return w
}

func TestWaiterStepExplorer(t *testing.T) {
	const seeds = 20000
	var granted, lost int
	steps := map[StepKind]int{}
	for seed := range uint64(seeds) {
		w := runSteps(seed, 60, nil)
		if w.err != nil {
			t.Fatal(w.err)
		}
		for k, n := range w.steps {
			steps[k] += n
		}
		if w.done {
			if w.q.Rule.Lost() {
				lost++
			} else {
				granted++
			}
		}
	}
	t.Logf("%d runs: %d granted, %d lost, %d waiting at the end; steps %v", seeds, granted, lost, seeds-granted-lost, steps)
	// Every kind of step must have been carried out, or the explorer does
	// not reach the code it is meant to check.
	for _, k := range []StepKind{StepHeld, StepLost, StepWait, StepReadOwn, StepConfirmOwn, StepRead, StepReadNear, StepFollow, StepRereadFar} {
		if steps[k] == 0 {
			t.Errorf("no run took a step of kind %d", k)
		}
	}
}
