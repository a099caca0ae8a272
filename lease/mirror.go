package lease

import (
	"cmp"
	"context"
	"slices"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// queueMirror is a Keeper's copy of every key under one lock name, kept by
// the name's shared queue watch. A Keeper's lock waits on the copy (join,
// blocked) instead of reading the queue, so its enqueue is a put alone.
//
// A lock joins only once the copy has applied its own put, in the epoch
// it subscribed in: the watch was up before the put and delivers every
// event in order, so the copy is then exactly what a read at its revision
// would give, and the lock's rule takes it as such (snapshot). The copy
// decides nothing: it wakes the waiters a deletion may grant, and their
// rules decide. When the watch goes down the copy is dropped, and each
// waiter's subscription hears of it.
type queueMirror struct {
	mu       sync.Mutex
	valid    bool        // the copy is complete for epoch
	counting bool        // the copy is off for epoch: too many keys
	count    int         // how many keys are under the name at rev, while counting
	epoch    queue.Epoch // the watch epoch the copy (or the count) belongs to
	base     int64       // the revision of the read the copy (or the count) started from
	rev      int64       // the newest revision applied
	keys     map[string]*mvccpb.KeyValue
	advanced chan struct{} // closed, and replaced, when rev moves or the copy is dropped
	// src is what reload reads from: the watch's client, and its epoch's
	// context, so that the read ends with the watch.
	src mirrorSource

	// The queue keys, and the writers' among them, oldest first. Keys
	// mostly leave from the front, where dead entries are skipped.
	queue, writers order
	waiters        map[int64]*Lock // the locks waiting on the copy, by token
	readers        int             // how many of the waiters are readers
}

// mirrorSource is what a mirror reads the copy from (queueMirror.src).
type mirrorSource struct {
	ctx context.Context
	cli *clientv3.Client
}

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

func newQueueMirror() *queueMirror {
	return &queueMirror{advanced: make(chan struct{})}
}

// load reads the keys under prefix at created or later, and makes them the
// copy (or count) of epoch. It reports false if the read failed.
func (m *queueMirror) load(ctx context.Context, cli *clientv3.Client, prefix string, created int64, epoch queue.Epoch) bool {
	page, rev, err := readMirror(ctx, cli, prefix, created)
	if err != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = mirrorSource{ctx, cli}
	m.install(prefix, page, rev, epoch)
	return true
}

// readMirror reads the first mirrorLimit keys under prefix, and how many
// there are, in a state no older than minRev; rev is the state's revision.
func readMirror(ctx context.Context, cli *clientv3.Client, prefix string, minRev int64) (page *pb.RangeResponse, rev int64, err error) {
	resp, err := readAtLeast(ctx, cli, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(prefix, append(opts, clientv3.WithPrefix(), clientv3.WithLimit(mirrorLimit))...)}
	})
	if err != nil {
		return nil, 0, err
	}
	return resp.Responses[0].GetResponseRange(), resp.Header.Revision, nil
}

// install makes page, read at rev, the copy (or count) of epoch. m.mu is held.
func (m *queueMirror) install(prefix string, page *pb.RangeResponse, rev int64, epoch queue.Epoch) {
	defer m.advance()
	m.epoch, m.base, m.rev = epoch, rev, rev
	if page.More {
		// etcd's Count is every key in the range, not only the page.
		m.goCounting(int(page.Count))
		return
	}
	m.keys = make(map[string]*mvccpb.KeyValue, len(page.Kvs))
	for _, kv := range page.Kvs {
		m.keys[string(kv.Key)] = kv
	}
	m.valid, m.counting, m.count = true, false, 0
	m.rebuildOrder(prefix)
}

// goCounting turns the copy off (n keys) and wakes its waiters. m.mu is held.
func (m *queueMirror) goCounting(n int) {
	m.valid, m.counting, m.count = false, true, n
	m.keys, m.queue, m.writers = nil, order{}, order{}
	m.wakeAll()
}

// rebuildOrder lists the copy's queue keys in order. m.mu is held.
func (m *queueMirror) rebuildOrder(prefix string) {
	m.queue, m.writers = order{}, order{}
	kvs := make([]*mvccpb.KeyValue, 0, len(m.keys))
	for _, kv := range m.keys {
		if isQueueKey(prefix, kv) {
			kvs = append(kvs, kv)
		}
	}
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return int(a.CreateRevision - b.CreateRevision) })
	for _, kv := range kvs {
		m.queue.entries = append(m.queue.entries, orderEntry{string(kv.Key), kv.CreateRevision})
		if modeOf(kv) == Write {
			m.writers.entries = append(m.writers.entries, orderEntry{string(kv.Key), kv.CreateRevision})
		}
	}
}

// apply moves the copy of epoch forward by events and wakes the waiters a
// deletion may grant; while the copy is off it counts keys instead.
func (m *queueMirror) apply(prefix string, events []*clientv3.Event, epoch queue.Epoch) {
	m.mu.Lock()
	reload := false
	switch {
	case m.epoch != epoch:
	case m.valid:
		m.applyCopy(prefix, events)
	case m.counting:
		reload = m.applyCount(events)
	}
	m.mu.Unlock()
	if reload {
		m.reload(prefix, epoch)
	}
}

// applyCopy is apply for a valid copy. m.mu is held.
func (m *queueMirror) applyCopy(prefix string, events []*clientv3.Event) {
	defer m.advance()
	deleted, reordered := false, false
	for _, ev := range events {
		if ev.Kv.ModRevision <= m.base {
			continue
		}
		d, r := m.applyEvent(prefix, ev)
		deleted, reordered = deleted || d, reordered || r
		m.rev = max(m.rev, ev.Kv.ModRevision)
	}
	switch {
	case len(m.keys) > mirrorLimit:
		m.goCounting(len(m.keys))
	case reordered:
		m.rebuildOrder(prefix)
		m.wakeAll()
	case deleted:
		// Only a deletion makes an entry dead.
		m.compact(&m.queue, false)
		m.compact(&m.writers, true)
		m.wakeHeads()
	}
}

// applyEvent applies one event to the copy, and tells whether it deleted
// a key and whether it changed the order lists. m.mu is held.
func (m *queueMirror) applyEvent(prefix string, ev *clientv3.Event) (deleted, reordered bool) {
	key := string(ev.Kv.Key)
	old := m.keys[key]
	switch {
	case ev.Type == mvccpb.DELETE:
		delete(m.keys, key)
		return old != nil, false
	case old != nil && old.CreateRevision == ev.Kv.CreateRevision:
		// A key changed in place (a leader's proclamation): its place
		// stays, but whether it is a writer's may have changed.
		m.keys[key] = ev.Kv
		return false, modeOf(old) != modeOf(ev.Kv) || isQueueKey(prefix, old) != isQueueKey(prefix, ev.Kv)
	}
	// A new key is the newest.
	m.keys[key] = ev.Kv
	if isQueueKey(prefix, ev.Kv) {
		m.queue.entries = append(m.queue.entries, orderEntry{key, ev.Kv.CreateRevision})
		if modeOf(ev.Kv) == Write {
			m.writers.entries = append(m.writers.entries, orderEntry{key, ev.Kv.CreateRevision})
		}
	}
	return false, false
}

// applyCount is apply while the copy is off, and tells whether the keys
// are now few enough to read the copy again. m.mu is held.
func (m *queueMirror) applyCount(events []*clientv3.Event) (reload bool) {
	defer m.advance()
	for _, ev := range events {
		if ev.Kv.ModRevision <= m.base {
			continue
		}
		// etcd sends a deletion only for a key that was there, and a put
		// of a key that was not has it created at that revision.
		switch {
		case ev.Type == mvccpb.DELETE:
			m.count--
		case ev.IsCreate():
			m.count++
		}
		m.rev = max(m.rev, ev.Kv.ModRevision)
	}
	return m.count <= mirrorResume
}

// reload reads the copy of epoch again, no older than the events counted.
// It runs on the watch's goroutine, so no event is applied meanwhile. On
// failure the copy stays off and the next events try again.
func (m *queueMirror) reload(prefix string, epoch queue.Epoch) {
	m.mu.Lock()
	src, rev := m.src, m.rev
	m.mu.Unlock()
	if src.cli == nil {
		return
	}
	page, at, err := readMirror(src.ctx, src.cli, prefix, rev)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counting && m.epoch == epoch {
		m.install(prefix, page, at, epoch)
	}
}

// compact drops o's dead entries once o holds more than twice the copy's
// keys plus compactSlack: at least half are then dead, so the cost is O(1)
// per event, amortised. m.mu is held.
func (m *queueMirror) compact(o *order, writers bool) {
	if len(o.entries) <= 2*len(m.keys)+compactSlack {
		return
	}
	live := make([]orderEntry, 0, len(m.keys))
	for _, e := range o.entries[o.front:] {
		if m.live(e, writers) {
			live = append(live, e)
		}
	}
	o.entries, o.front = live, 0
}

// live tells whether e's key is in the copy with e's creation revision
// (and, for writers, still a writer's). m.mu is held.
func (m *queueMirror) live(e orderEntry, writers bool) bool {
	kv := m.keys[e.key]
	return kv != nil && kv.CreateRevision == e.rev && (!writers || modeOf(kv) == Write)
}

// wakeHeads wakes the waiters that may hold the lock now: the oldest key's
// waiter, and every reader older than the oldest writer. m.mu is held.
func (m *queueMirror) wakeHeads() {
	if len(m.waiters) == 0 {
		return
	}
	head := m.oldest(&m.queue, false)
	if l := m.waiters[head]; l != nil {
		l.wake()
	}
	if m.readers == 0 {
		return
	}
	writer := m.oldest(&m.writers, true)
	for token, l := range m.waiters {
		if l.mode == Read && (writer == 0 || token < writer) {
			l.wake()
		}
	}
}

// wakeAll wakes every waiter. m.mu is held.
func (m *queueMirror) wakeAll() {
	for _, l := range m.waiters {
		l.poke()
	}
}

// oldest is the creation revision of o's oldest live key, or 0. m.mu is held.
func (m *queueMirror) oldest(o *order, writers bool) int64 {
	for ; o.front < len(o.entries); o.front++ {
		if e := o.entries[o.front]; m.live(e, writers) {
			return e.rev
		}
	}
	o.entries, o.front = o.entries[:0], 0
	return 0
}

// mirrorView is the copy's snapshot for one lock: what a read of the
// queue at rev, one page of a single key, would have shown it.
type mirrorView struct {
	ok       bool               // there is a copy of the lock's epoch; the rest is unset if not
	rev      int64              // the revision the copy is the state of
	base     int64              // the revision the copy was read at: it holds every event after
	own      *mvccpb.KeyValue   // the lock's own key in the copy; nil if absent
	older    []*mvccpb.KeyValue // the newest queue key older than the lock's token that blocks it, if any
	complete bool               // no blocking key is older than those listed: none is listed
}

// snapshot is the copy of epoch as l's rule takes a read of one page: its
// own key and the nearest key older than its token that blocks it, with
// complete set if there is none. A waiter looks again whenever the copy
// wakes it, so the nearest key is all its rule needs; the copy finds it in
// its order lists at no cost per key ahead. ok is false if there is no
// copy of epoch.
func (m *queueMirror) snapshot(epoch queue.Epoch, l *Lock) mirrorView {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.epoch != epoch {
		return mirrorView{}
	}
	v := mirrorView{ok: true, own: m.keys[l.key], rev: m.rev, base: m.base}
	o, writers := &m.queue, false
	if l.mode == Read {
		o, writers = &m.writers, true
	}
	if head := m.oldest(o, writers); head == 0 || head >= l.token {
		v.complete = true
		return v
	}
	i, _ := slices.BinarySearchFunc(o.entries[o.front:], l.token, func(e orderEntry, t int64) int { return cmp.Compare(e.rev, t) })
	for j := o.front + i - 1; j >= o.front; j-- {
		if e := o.entries[j]; m.live(e, writers) {
			v.older = []*mvccpb.KeyValue{m.keys[e.key]}
			break
		}
	}
	return v
}

// ahead counts the keys in the copy older than l's token that block it,
// for the tracing hooks (CallHooks.Queued): a walk over them, once per
// call. ok is false if there is no copy.
func (m *queueMirror) ahead(l *Lock) (n int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid {
		return 0, false
	}
	o, writers := &m.queue, false
	if l.mode == Read {
		o, writers = &m.writers, true
	}
	i, _ := slices.BinarySearchFunc(o.entries[o.front:], l.token, func(e orderEntry, t int64) int { return cmp.Compare(e.rev, t) })
	for _, e := range o.entries[o.front : o.front+i] {
		if m.live(e, writers) {
			n++
		}
	}
	return n, true
}

// only tells whether l's own key is the only key under the name.
func (m *queueMirror) only(l *Lock) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	own := m.keys[l.key]
	return m.valid && len(m.keys) == 1 && own != nil && own.CreateRevision == l.token
}

// leave unregisters waiter l. token is read by the caller under l.mu: the
// lock's finish may run while its enqueue is returning.
func (m *queueMirror) leave(l *Lock, token int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiters[token] == l {
		delete(m.waiters, token)
		if l.mode == Read {
			m.readers--
		}
	}
}

// drop drops the copy as the watch goes down, and wakes its waiters.
func (m *queueMirror) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.valid, m.counting, m.count, m.keys = false, false, 0, nil
	m.queue, m.writers, m.src = order{}, order{}, mirrorSource{}
	m.wakeAll()
	m.advance()
}

// advance wakes those waiting for the copy to move. m.mu is held.
func (m *queueMirror) advance() {
	close(m.advanced)
	m.advanced = make(chan struct{})
}

// join waits until the copy of epoch has applied l's own put, then
// registers l as a waiter. It reports false at once if there is no copy of
// epoch, or when ctx or done ends: l then reads its view.
func (m *queueMirror) join(ctx context.Context, done <-chan struct{}, epoch queue.Epoch, l *Lock) bool {
	for {
		m.mu.Lock()
		if !m.valid || m.epoch != epoch {
			m.mu.Unlock()
			return false
		}
		if m.rev >= l.token {
			select {
			case <-done:
				// The lock ended, and its finish may have left already:
				// registered now, it would stay a waiter for good.
				m.mu.Unlock()
				return false
			default:
			}
			if m.waiters == nil {
				m.waiters = make(map[int64]*Lock)
			}
			m.waiters[l.token] = l
			if l.mode == Read {
				m.readers++
			}
			m.mu.Unlock()
			return true
		}
		advanced := m.advanced
		m.mu.Unlock()
		select {
		case <-advanced:
		case <-done:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
