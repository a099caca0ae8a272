package lease

import (
	"context"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/keyread"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// queueMirror is a Keeper's copy of every key under one lock name
// (queue.Copy, which says what the copy holds and whom a change wakes),
// kept by the name's shared queue watch: this side reads the copy, feeds
// it the watch's events, and wakes the locks it names. A Keeper's lock
// waits on the copy (join, then Lock.joinCopy) instead of reading the
// queue, so its enqueue is a put alone.
type queueMirror struct {
	mu       sync.Mutex
	c        *queue.Copy
	advanced chan struct{} // closed, and replaced, when the copy moves or is dropped
	// src is what reload reads from: the watch's client, and its epoch's
	// context, so that the read ends with the watch.
	src     mirrorSource
	waiters map[int64]copyWaiter // the locks waiting on the copy, by token
	heads   []int64              // the copy's wake set, kept so that a deletion allocates nothing
}

// copyWaiter is a lock as the copy sees it: Done is closed once it has
// ended; nudge wakes it to look again: grant, because a deletion may grant
// it (the copy says so); otherwise because something else changed.
type copyWaiter interface {
	Done() <-chan struct{}
	nudge(grant bool)
}

// mirrorSource is what a mirror reads the copy from (queueMirror.src).
type mirrorSource struct {
	ctx context.Context
	cli *clientv3.Client
}

// newQueueMirror makes the mirror of the queue under prefix.
func newQueueMirror(prefix string) *queueMirror {
	return &queueMirror{advanced: make(chan struct{}), c: queue.NewCopy(queue.CopyConfig{
		IsQueueKey: func(kv *mvccpb.KeyValue) bool { return isQueueKey(prefix, kv) },
		IsWriter:   func(kv *mvccpb.KeyValue) bool { return modeOf(kv) == Write },
		Limit:      mirrorLimit, Resume: mirrorResume, Slack: compactSlack,
	})}
}

// Load reads the keys under prefix at created or later, and makes them the
// copy (or count) of epoch. It reports false if the read failed
// (watch.Copy).
func (m *queueMirror) Load(ctx context.Context, cli *clientv3.Client, prefix string, created int64, epoch queue.Epoch) bool {
	page, rev, err := readMirror(ctx, cli, prefix, created)
	if err != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = mirrorSource{ctx, cli}
	m.install(page, rev, epoch)
	return true
}

// readMirror reads the first mirrorLimit keys under prefix, and how many
// there are, in a state no older than minRev; rev is the state's revision.
func readMirror(ctx context.Context, cli *clientv3.Client, prefix string, minRev int64) (page *pb.RangeResponse, rev int64, err error) {
	resp, err := keyread.ReadAtLeast(ctx, cli, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(prefix, append(opts, clientv3.WithPrefix(), clientv3.WithLimit(mirrorLimit))...)}
	})
	if err != nil {
		return nil, 0, err
	}
	return resp.Responses[0].GetResponseRange(), resp.Header.Revision, nil
}

// install makes page, read at rev, the copy (or count) of epoch (etcd's
// Count is every key in the range, not only the page). m.mu is held.
func (m *queueMirror) install(page *pb.RangeResponse, rev int64, epoch queue.Epoch) {
	m.wake(m.c.Install(page.Kvs, page.More, int(page.Count), rev, epoch))
	m.advance()
}

// Apply moves the copy of epoch forward by events and wakes the waiters a
// deletion may grant; while the copy is off it counts keys instead, and
// reads it again once they are few enough (watch.Copy).
func (m *queueMirror) Apply(prefix string, events []*mvccpb.Event, epoch queue.Epoch) {
	evs := queue.Events{N: len(events), At: func(i int) *mvccpb.Event { return events[i] }}
	m.mu.Lock()
	moved := m.c.Current(epoch)
	wake, reload := m.c.Apply(evs, epoch, m.heads)
	if wake.Heads != nil {
		m.heads = wake.Heads
	}
	m.wake(wake)
	if moved {
		m.advance()
	}
	m.mu.Unlock()
	if reload {
		m.reload(prefix, epoch)
	}
}

// reload reads the copy of epoch again, no older than the events counted.
// It runs on the watch's goroutine, so no event is applied meanwhile. On
// failure the copy stays off and the next events try again.
func (m *queueMirror) reload(prefix string, epoch queue.Epoch) {
	m.mu.Lock()
	src := m.src
	rev, _ := m.c.Reloadable(epoch)
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
	if _, ok := m.c.Reloadable(epoch); ok {
		m.install(page, at, epoch)
	}
}

// wake wakes whom the copy says: every waiter (poke), or the heads, which
// a deletion may grant (wake, which a fault-suite mutant drops). m.mu is
// held.
func (m *queueMirror) wake(w queue.Wake) {
	if w.All {
		for _, l := range m.waiters {
			l.nudge(false)
		}
		return
	}
	for _, token := range w.Heads {
		if l := m.waiters[token]; l != nil {
			l.nudge(true)
		}
	}
}

// snapshot is the copy of epoch as the rule of the lock with key and
// token takes a read of one page (queue.Copy.Snapshot).
func (m *queueMirror) snapshot(epoch queue.Epoch, key string, token int64, reader bool) queue.CopyView {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.Snapshot(epoch, key, token, reader)
}

// ahead counts the keys in the copy older than token that block its lock
// (reader: a reader's), for the tracing hooks (CallHooks.Queued): a walk
// over them, once per call. ok is false if there is no copy.
func (m *queueMirror) ahead(token int64, reader bool) (n int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.Ahead(token, reader)
}

// only tells whether the key made at token is the only key under the name.
func (m *queueMirror) only(key string, token int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.Only(key, token)
}

// leave unregisters waiter l. token is read by the caller under t.mu: the
// lock's finish may run while its enqueue is returning.
func (m *queueMirror) leave(l copyWaiter, token int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiters[token] == l {
		delete(m.waiters, token)
		m.c.Leave(token)
	}
}

// Drop drops the copy as the watch goes down, and wakes its waiters
// (watch.Copy).
func (m *queueMirror) Drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = mirrorSource{}
	m.wake(m.c.Drop())
	m.advance()
}

// advance wakes those waiting for the copy to move. m.mu is held.
func (m *queueMirror) advance() {
	close(m.advanced)
	m.advanced = make(chan struct{})
}

// join waits until the copy of epoch has applied the put of l, the lock
// made at token (reader: a reader's), then registers l as a waiter. It
// reports false at once if there is no copy of epoch, or when ctx or l
// ends: l then reads its view.
func (m *queueMirror) join(ctx context.Context, epoch queue.Epoch, l copyWaiter, token int64, reader bool) bool {
	done := l.Done()
	for {
		m.mu.Lock()
		select {
		case <-done:
			// The lock ended, and its finish may have left already:
			// registered now, it would stay a waiter for good.
			m.mu.Unlock()
			return false
		default:
		}
		joined, wait := m.c.Join(epoch, token, reader)
		if joined {
			if m.waiters == nil {
				m.waiters = make(map[int64]copyWaiter)
			}
			m.waiters[token] = l
		}
		advanced := m.advanced
		m.mu.Unlock()
		if !wait {
			return joined
		}
		select {
		case <-advanced:
		case <-done:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
