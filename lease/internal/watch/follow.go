package watch

import (
	"context"
	"sync"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// Follows are a name's watches of single queue keys ahead, kept across the
// session's locks of the name: lock keys are named by session, so a far
// waiter behind the same sessions as the last one opens nothing to start.
type Follows struct {
	start func(key string) (*Watch, error) // starts the watch of a key ahead
	keep  int                              // how many watches are kept (NewFollows)

	mu   sync.Mutex
	m    map[string]*followed
	tick uint64 // counts take calls, for least recently used
}

// A nil *Follows keeps no watches: a name none of whose waiters was far
// has none, and its methods other than Ensure see no watch kept.

// NewFollows makes a name's Follows: start starts the watch of a key, and
// at most keep watches are kept, the least recently used closed.
func NewFollows(start func(key string) (*Watch, error), keep int) *Follows {
	return &Follows{start: start, keep: keep}
}

// followed is one watch of a key ahead.
type followed struct {
	w    *Watch
	used uint64
}

// Subscribe makes l a subscriber of every watch kept, as a view is about
// to be read, and returns their epochs: a key whose watch was up (odd
// epoch) through the read is followed from the read on.
func (f *Follows) Subscribe(l Listener) map[string]queue.Epoch {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	ws := make(map[string]*Watch, len(f.m))
	for k, fw := range f.m {
		ws[k] = fw.w
	}
	f.mu.Unlock()
	if len(ws) == 0 {
		return nil // no far wait yet: nothing to allocate for
	}
	// Outside f.mu: subscribing (Listener.SubscribeTo) takes the lock's
	// mutex, and f.mu is taken under it (EpochOf).
	epochs := make(map[string]queue.Epoch, len(ws))
	for k, w := range ws {
		epochs[k] = l.SubscribeTo(w)
	}
	return epochs
}

// EpochOf is the current epoch of the watch of key, if one is kept.
func (f *Follows) EpochOf(key string) (queue.Epoch, bool) {
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fw, ok := f.m[key]
	if !ok {
		return 0, false
	}
	return fw.w.Epoch(), true
}

// Ensure takes the watches of keys, subscribes l and waits until each is
// up. It returns their epochs and the highest revision one came up at or
// handed on: a read no older than it misses no deletion of the keys.
func (f *Follows) Ensure(ctx context.Context, l Listener, keys []string) (map[string]queue.Epoch, int64, error) {
	ws, err := f.take(keys)
	if err != nil {
		return nil, 0, err
	}
	epochs := make(map[string]queue.Epoch, len(keys))
	var upRev int64
	for i, w := range ws {
		l.SubscribeTo(w)
		epoch, err := w.UpEpoch(ctx, l)
		if err != nil {
			return nil, 0, err
		}
		epochs[keys[i]] = epoch
		upRev = max(upRev, w.upRev.Load(), w.seenRev.Load())
	}
	return epochs, upRev, nil
}

// take returns the watches of keys, starting those not kept, and closes
// the least recently used ones beyond keep.
func (f *Follows) take(keys []string) ([]*Watch, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = make(map[string]*followed)
	}
	f.tick++
	ws := make([]*Watch, len(keys))
	for i, k := range keys {
		fw := f.m[k]
		if fw == nil {
			w, err := f.start(k)
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
	var evicted []*Watch
	for len(f.m) > f.keep {
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
		w.Stop()
	}
	return ws, nil
}

// Unsubscribe stops every kept watch's events going to l.
func (f *Follows) Unsubscribe(l Listener) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fw := range f.m {
		fw.w.Unsubscribe(l)
	}
}

// Stop closes every kept watch.
func (f *Follows) Stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	m := f.m
	f.m = nil
	f.mu.Unlock()
	for _, fw := range m {
		fw.w.Stop()
	}
}
