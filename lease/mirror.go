package lease

import (
	"context"
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
// queued through the Keeper takes its view of the keys ahead from the copy
// instead of reading it, so its enqueue is a put alone whatever the length
// of the queue (a read of the queue costs etcd a fetch of every key under
// the name, as it sorts them).
//
// The copy is only ever used at a revision no older than the lock's own
// put and in the watch epoch the lock subscribed in, so it is exactly the
// state a read at that revision would give: the watch has been up since
// before the put, and delivered every event of the prefix in order.
type queueMirror struct {
	mu       sync.Mutex
	valid    bool   // the copy is complete for epoch
	epoch    uint64 // the watch epoch the copy belongs to
	base     int64  // the revision of the read the copy started from
	rev      int64  // the newest revision applied
	keys     map[string]*mvccpb.KeyValue
	advanced chan struct{} // closed, and replaced, when rev moves or the copy is dropped
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
	return true
}

// apply brings the copy forward by events, delivered in epoch in revision
// order. Events the first read already covered are skipped.
func (m *queueMirror) apply(events []*clientv3.Event, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.epoch != epoch {
		return
	}
	for _, ev := range events {
		if ev.Kv.ModRevision <= m.base {
			continue
		}
		key := string(ev.Kv.Key)
		if ev.Type == mvccpb.DELETE {
			delete(m.keys, key)
		} else {
			m.keys[key] = ev.Kv
		}
		m.rev = max(m.rev, ev.Kv.ModRevision)
	}
	if len(m.keys) > mirrorLimit {
		m.valid, m.keys = false, nil
	}
	m.advance()
}

// drop marks the copy out of date: the watch went down.
func (m *queueMirror) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.valid, m.keys = false, nil
	m.advance()
}

// advance wakes those waiting for the copy to move. m.mu is held.
func (m *queueMirror) advance() {
	close(m.advanced)
	m.advanced = make(chan struct{})
}

// at waits until the copy of epoch has applied revision rev, and returns
// its keys created before rev and the revision the copy is at. It reports
// false, at once, if there is no copy of epoch (none yet, or the watch went
// down since), or when ctx or done ends: the caller then reads instead.
func (m *queueMirror) at(ctx context.Context, done <-chan struct{}, epoch uint64, rev int64) ([]*mvccpb.KeyValue, int64, bool) {
	for {
		m.mu.Lock()
		if !m.valid || m.epoch != epoch {
			m.mu.Unlock()
			return nil, 0, false
		}
		if m.rev >= rev {
			kvs := make([]*mvccpb.KeyValue, 0, len(m.keys))
			for _, kv := range m.keys {
				if kv.CreateRevision < rev {
					kvs = append(kvs, kv)
				}
			}
			at := m.rev
			m.mu.Unlock()
			return kvs, at, true
		}
		advanced := m.advanced
		m.mu.Unlock()
		select {
		case <-advanced:
		case <-done:
			return nil, 0, false
		case <-ctx.Done():
			return nil, 0, false
		}
	}
}
