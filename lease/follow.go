package lease

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// follows are a name's watches of single queue keys ahead, kept across the
// session's locks of the name: lock keys are named by session, so a far
// waiter behind the same sessions as the last one opens nothing to start.
type follows struct {
	s *Session

	mu   sync.Mutex
	m    map[string]*followed
	tick uint64 // counts take calls, for least recently used
}

// followed is one watch of a key ahead.
type followed struct {
	w    *keyWatch
	used uint64
}

// subscribe makes l a subscriber of every watch kept, as a view is about
// to be read, and returns their epochs: a key whose watch was up (odd
// epoch) through the read is followed from the read on.
func (f *follows) subscribe(l listener) map[string]queue.Epoch {
	f.mu.Lock()
	ws := make(map[string]*keyWatch, len(f.m))
	for k, fw := range f.m {
		ws[k] = fw.w
	}
	f.mu.Unlock()
	if len(ws) == 0 {
		return nil // no far wait yet: nothing to allocate for
	}
	// Outside f.mu: subscribing takes t.mu, and f.mu is taken under t.mu
	// (look, through epochOf).
	epochs := make(map[string]queue.Epoch, len(ws))
	for k, w := range ws {
		epochs[k] = l.subscribeTo(w)
	}
	return epochs
}

// epochOf is the current epoch of the watch of key, if one is kept.
func (f *follows) epochOf(key string) (queue.Epoch, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fw, ok := f.m[key]
	if !ok {
		return 0, false
	}
	return fw.w.epochNow(), true
}

// ensure takes the watches of keys, subscribes l and waits until each is
// up. It returns their epochs and the highest revision one came up at or
// handed on: a read no older than it misses no deletion of the keys.
func (f *follows) ensure(ctx context.Context, l listener, keys []string) (map[string]queue.Epoch, int64, error) {
	ws, err := f.take(keys)
	if err != nil {
		return nil, 0, err
	}
	epochs := make(map[string]queue.Epoch, len(keys))
	var upRev int64
	for i, w := range ws {
		l.subscribeTo(w)
		epoch, err := w.upEpoch(ctx, l)
		if err != nil {
			return nil, 0, err
		}
		epochs[keys[i]] = epoch
		upRev = max(upRev, w.upRev.Load(), w.seenRev.Load())
	}
	return epochs, upRev, nil
}

// take returns the watches of keys, starting those not kept, and closes
// the least recently used ones beyond keptFollows.
func (f *follows) take(keys []string) ([]*keyWatch, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = make(map[string]*followed)
	}
	f.tick++
	ws := make([]*keyWatch, len(keys))
	for i, k := range keys {
		fw := f.m[k]
		if fw == nil {
			w, err := f.s.startFollowWatch(k)
			if err != nil {
				f.mu.Unlock()
				return nil, err
			}
			fw = &followed{w: w}
			f.m[k] = fw
		}
		fw.used = f.tick
		ws[i] = fw.w
	}
	var evicted []*keyWatch
	for len(f.m) > keptFollows {
		oldest := ""
		for k, fw := range f.m {
			if fw.used != f.tick && (oldest == "" || fw.used < f.m[oldest].used) {
				oldest = k
			}
		}
		if oldest == "" {
			break
		}
		evicted = append(evicted, f.m[oldest].w)
		delete(f.m, oldest)
	}
	f.mu.Unlock()
	for _, w := range evicted {
		w.stop()
	}
	return ws, nil
}

// unsubscribe stops every kept watch's events going to l.
func (f *follows) unsubscribe(l listener) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fw := range f.m {
		fw.w.unsubscribe(l)
	}
}

// stop closes every kept watch.
func (f *follows) stop() {
	f.mu.Lock()
	m := f.m
	f.m = nil
	f.mu.Unlock()
	for _, fw := range m {
		fw.w.stop()
	}
}

// startFollowWatch starts a watch of key, a queue key ahead of one of the
// session's locks. It keeps puts: one that moves the key off its lease
// makes it no lock, which the waiter must hear as it hears a deletion.
func (s *Session) startFollowWatch(key string) (*keyWatch, error) {
	return s.startWatch(key, false)
}

// follow starts following the newest keys ahead of a far waiter: once
// their watches are up it reads the keys, as a deletion before then went
// unseen, and a put since the view may have changed one. A key found gone
// counts as deleted; one that no longer blocks is dropped.
func (t *tracker) follow(ctx context.Context) error {
	t.mu.Lock()
	keys := t.q.FollowKeys()
	minRev := t.q.FollowFloor(keys)
	t.mu.Unlock()
	epochs, upRev, err := t.w.follows.ensure(ctx, t, keys)
	if err != nil {
		return err
	}
	resp, err := readAtLeast(ctx, t.s.client, max(minRev, upRev), func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k, opts...)
		}
		return ops
	})
	if err != nil {
		return err
	}
	kvs := make([]*mvccpb.KeyValue, len(keys))
	for i := range keys {
		kvs[i] = firstKV(resp.Responses[i].GetResponseRange().Kvs)
	}
	t.mu.Lock()
	t.q.Followed(resp.Header.Revision, keys, kvs, epochs)
	t.mu.Unlock()
	return nil
}

// rereadFar reads a far waiter's view again after a key it followed went,
// with the queue watch up. Usually the waiter is then second, behind the
// new holder, and the queue watch delivers that holder's deletion in order
// with any change of the own key: the grant needs no read after it, where
// the follow watch of that key alone would need one of the own key, a
// round trip on the handoff's path, provided the watch is up and the view
// read before the new holder releases, as it usually is. The read is of
// the older keys keys-only (served from etcd 3.7's index), and in full
// only if that shows keys the waiter does not know or that changed since
// it read them (relist). A view that shows it still far sends it back to
// following (look), pausing the queue watch.
func (t *tracker) rereadFar(ctx context.Context) error {
	t.mu.Lock()
	t.q.FarDone()
	t.mu.Unlock()
	epoch, err := t.w.queue.upEpoch(ctx, t)
	if err != nil {
		return err
	}
	ownEpoch, err := t.w.own.upEpoch(ctx, t)
	if err != nil {
		return err
	}
	pfx := t.name + "/"
	older, rev, err := t.readWithOwn(ctx, ownEpoch, epoch, 0, func(opts ...clientv3.OpOption) clientv3.Op {
		return clientv3.OpGet(pfx, append(opts, clientv3.WithPrefix(),
			clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(t.token-1), clientv3.WithLimit(queuePage))...)
	})
	if err != nil {
		return err
	}
	if older.More || !t.relist(rev, older.Kvs) {
		return t.readView(ctx, ownEpoch, epoch, 0)
	}
	return nil
}

// relist makes kvs, a keys-only read at rev of the keys older than the
// lock's own, the rule's snapshot if it shows nothing the waiter does not
// know (queue.Waiter.Relist), and otherwise reports false.
func (t *tracker) relist(rev int64, kvs []*mvccpb.KeyValue) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.q.Relist(rev, t.ownKV(), kvs)
}
