package lease

import (
	"context"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// mirrorLimit is the most keys a queue mirror keeps. A name with more keys
// under it (a very long queue, or data kept under the name) has no mirror:
// its locks read their view as without one.
const mirrorLimit = 4096

// queueMirror is a Keeper's copy of every key under one lock name, kept by
// the name's shared queue watch: read once when the watch comes up, then
// brought forward by each put and deletion the watch delivers. A lock
// queued through the Keeper waits on the copy instead of reading the queue
// (join, blocked), so its enqueue is a put alone whatever the length of
// the queue (a read of the queue costs etcd a fetch of every key under the
// name, as it sorts them), and a deletion wakes only the waiters it grants.
//
// A lock joins only once the copy has applied its own put, in the watch
// epoch the lock subscribed in, so from then on the copy is exactly the
// state a read at its revision would give: the watch has been up since
// before the put, and delivers every event of the prefix in order. When
// the watch goes down the copy is dropped and its waiters read instead.
type queueMirror struct {
	mu       sync.Mutex
	valid    bool   // the copy is complete for epoch
	epoch    uint64 // the watch epoch the copy belongs to
	base     int64  // the revision of the read the copy started from
	rev      int64  // the newest revision applied
	keys     map[string]*mvccpb.KeyValue
	advanced chan struct{} // closed, and replaced, when rev moves or the copy is dropped

	// The queue in order: the queue keys and the writers' among them,
	// oldest first. Entries whose key is gone are skipped from the front as
	// they are met (keys leave the queue mostly from its front), so finding
	// the head costs nothing per waiter.
	queue, writers order
	// waiters are the locks waiting on the copy, by token: each deletion
	// wakes only those it may have granted.
	waiters map[int64]*Lock
	readers int // how many of the waiters are readers
}

// order is a list of queue keys by creation revision, with the dead ones
// still in it until they reach the front.
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

// load reads every key under prefix in a state no older than created (the
// revision at which the watch came up) and makes it the copy of epoch. It
// reports false if the read failed; a prefix with more than mirrorLimit
// keys leaves the mirror off without failing.
func (m *queueMirror) load(ctx context.Context, cli *clientv3.Client, prefix string, created int64, epoch uint64) bool {
	resp, err := readAtLeast(ctx, cli, created, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(prefix, append(opts, clientv3.WithPrefix(), clientv3.WithLimit(mirrorLimit))...)}
	})
	if err != nil {
		return false
	}
	page := resp.Responses[0].GetResponseRange()
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.advance()
	if page.More {
		m.valid = false
		return true
	}
	m.keys = make(map[string]*mvccpb.KeyValue, len(page.Kvs))
	for _, kv := range page.Kvs {
		m.keys[string(kv.Key)] = kv
	}
	m.valid, m.epoch, m.base, m.rev = true, epoch, resp.Header.Revision, resp.Header.Revision
	m.rebuildOrder(prefix)
	return true
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

// apply brings the copy forward by events of the queue under prefix,
// delivered in epoch in revision order, and wakes the waiters that a
// deletion may have granted. Events the first read already covered are
// skipped.
func (m *queueMirror) apply(prefix string, events []*clientv3.Event, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.epoch != epoch {
		return
	}
	deleted, reordered := false, false
	for _, ev := range events {
		if ev.Kv.ModRevision <= m.base {
			continue
		}
		key := string(ev.Kv.Key)
		old := m.keys[key]
		switch {
		case ev.Type == mvccpb.DELETE:
			delete(m.keys, key)
			deleted = deleted || old != nil
		case old != nil && old.CreateRevision == ev.Kv.CreateRevision:
			// A key changed in place (a leader's proclamation): its place
			// stays, but whether it is a writer's may have changed.
			m.keys[key] = ev.Kv
			reordered = reordered || modeOf(old) != modeOf(ev.Kv) || isQueueKey(prefix, old) != isQueueKey(prefix, ev.Kv)
		default:
			// A new key: the newest, so the end of the order.
			m.keys[key] = ev.Kv
			if isQueueKey(prefix, ev.Kv) {
				m.queue.entries = append(m.queue.entries, orderEntry{key, ev.Kv.CreateRevision})
				if modeOf(ev.Kv) == Write {
					m.writers.entries = append(m.writers.entries, orderEntry{key, ev.Kv.CreateRevision})
				}
			}
		}
		m.rev = max(m.rev, ev.Kv.ModRevision)
	}
	if len(m.keys) > mirrorLimit {
		m.valid, m.keys = false, nil
		m.wakeAll()
	} else if reordered {
		m.rebuildOrder(prefix)
		m.wakeAll()
	} else if deleted {
		m.wakeHeads()
	}
	m.advance()
}

// wakeHeads wakes the waiters that may hold the lock now: the writer whose
// key is the oldest in the queue, and every reader older than the oldest
// writer. m.mu is held.
func (m *queueMirror) wakeHeads() {
	if len(m.waiters) == 0 {
		return
	}
	head := m.oldest(&m.queue, false)
	if l := m.waiters[head]; l != nil {
		l.poke()
	}
	if m.readers == 0 {
		return
	}
	writer := m.oldest(&m.writers, true)
	for token, l := range m.waiters {
		if l.mode == Read && (writer == 0 || token < writer) {
			l.poke()
		}
	}
}

// wakeAll wakes every waiter, to look again. m.mu is held.
func (m *queueMirror) wakeAll() {
	for _, l := range m.waiters {
		l.poke()
	}
}

// oldest is the creation revision of the oldest live key in o (0 if none),
// dropping the dead ones from its front. A key counts if it is in the copy
// with that creation revision (and, for writers, is still a writer's).
// m.mu is held.
func (m *queueMirror) oldest(o *order, writers bool) int64 {
	for o.front < len(o.entries) {
		e := o.entries[o.front]
		if kv := m.keys[e.key]; kv != nil && kv.CreateRevision == e.rev && (!writers || modeOf(kv) == Write) {
			return e.rev
		}
		o.front++
		if o.front >= 64 && o.front*2 >= len(o.entries) {
			// Most of the list is dead: keep only the rest, so that a queue
			// that never empties does not grow its list for ever.
			o.entries, o.front = slices.Clone(o.entries[o.front:]), 0
		}
	}
	o.entries, o.front = o.entries[:0], 0
	return 0
}

// blocked tells whether lock l still has a key ahead that blocks it, in
// the copy of epoch; ok is false if there is no such copy (the watch went
// down since): l must read its view. If it is blocked, pred is the nearest
// key ahead of it. A lock whose own key is gone from the copy is blocked
// for good: its own-key watch ends it.
func (m *queueMirror) blocked(epoch uint64, l *Lock) (blocked bool, pred *mvccpb.KeyValue, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.epoch != epoch {
		return false, nil, false
	}
	token, mode := l.token, l.mode
	if own := m.keys[l.key]; own == nil || own.CreateRevision != token {
		return true, nil, true
	}
	o, writers := &m.queue, false
	if mode == Read {
		o, writers = &m.writers, true
	}
	if head := m.oldest(o, writers); head == 0 || head >= token {
		return false, nil, true
	}
	// The nearest key ahead, for errors that name it: the newest live
	// entry older than the token.
	i, _ := slices.BinarySearchFunc(o.entries[o.front:], token, func(e orderEntry, t int64) int { return int(e.rev - t) })
	for j := o.front + i - 1; j >= o.front; j-- {
		e := o.entries[j]
		if kv := m.keys[e.key]; kv != nil && kv.CreateRevision == e.rev {
			return true, &mvccpb.KeyValue{Key: []byte(e.key), CreateRevision: e.rev}, true
		}
	}
	return true, nil, true
}

// only tells whether lock l's own key is the only key under the name in
// the copy: nobody else is queued, before or after it.
func (m *queueMirror) only(l *Lock) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	own := m.keys[l.key]
	return m.valid && len(m.keys) == 1 && own != nil && own.CreateRevision == l.token
}

// leave unregisters a waiter (see join) whose token is token (read by the
// caller under the lock's mutex: the lock's finish may run while its
// enqueue is returning).
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

// drop marks the copy out of date, and wakes its waiters to read their
// view instead: the watch went down.
func (m *queueMirror) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.valid, m.keys = false, nil
	m.queue, m.writers = order{}, order{}
	m.wakeAll()
	m.advance()
}

// advance wakes those waiting for the copy to move. m.mu is held.
func (m *queueMirror) advance() {
	close(m.advanced)
	m.advanced = make(chan struct{})
}

// join waits until the copy of epoch has applied lock l's own put, and
// then registers l as a waiter, woken (poke) whenever a deletion may have
// granted it; from then on l asks blocked instead of keeping a view of its
// own. It reports false, at once, if there is no copy of epoch (none yet,
// or the watch went down since), or when ctx or done ends: l then reads
// its view instead.
func (m *queueMirror) join(ctx context.Context, done <-chan struct{}, epoch uint64, l *Lock) bool {
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
