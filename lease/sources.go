package lease

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lock's watches feed its knowledge, each as a source whose
// generations are the watch's epochs.

// sourceOf names watch w as a source of l's knowledge, with the keys it
// covers (nil: the whole queue) and whether it covers the own key (the
// queue watch keeps puts). A new watch of a key ahead is a new source.
func (l *Lock) sourceOf(w *keyWatch) (src source, keys []string, coversOwn bool) {
	switch {
	case w == l.w.own:
		return "own", []string{l.key}, true
	case w == l.w.queue:
		return "queue", nil, true
	}
	return source(fmt.Sprintf("follow %s %p", w.key, w)), []string{w.key}, false
}

// subscribeTo makes l a subscriber of w and returns w's epoch. If w is
// up, it covers l from the revision after the last response it handed on
// (loaded after subscribing, so never below what l missed).
func (l *Lock) subscribeTo(w *keyWatch) uint64 {
	epoch := w.subscribe(l)
	if epoch%2 == 0 {
		return epoch
	}
	src, keys, own := l.sourceOf(w)
	l.mu.Lock()
	// Loaded under l.mu: a response handed on after the load waits for
	// l.mu, so it reaches the rule after the source is up.
	l.q.know.up(src, epoch, w.seenRev.Load()+1, keys, own)
	l.mu.Unlock()
	l.poke()
	return epoch
}

// sourceUp records that w came up in epoch, delivering every change of
// its range from start on, and wakes the waiter. As the own-key watch
// comes up a holder reads its key again (recheck), as a deletion while
// the watch was down went unseen; an error means that read failed.
func (l *Lock) sourceUp(ctx context.Context, w *keyWatch, epoch uint64, start int64) error {
	src, keys, own := l.sourceOf(w)
	l.mu.Lock()
	l.q.know.up(src, epoch, start, keys, own)
	l.mu.Unlock()
	l.poke()
	if w == l.w.own {
		return l.recheck(ctx)
	}
	return nil
}

// sourceDown records that w went down, ending epoch-1, and wakes the waiter.
func (l *Lock) sourceDown(w *keyWatch, epoch uint64) {
	src, _, _ := l.sourceOf(w)
	l.mu.Lock()
	l.q.know.down(src, epoch)
	l.mu.Unlock()
	l.poke()
}

// ownKV is the own key as a read that found it this holding's shows it.
// l.mu is held.
func (l *Lock) ownKV() *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(l.key), CreateRevision: l.token, ModRevision: l.token, Lease: int64(l.s.id)}
}

// feed hands the knowledge one watch response's events. l.mu is held.
func (l *Lock) feed(w *keyWatch, events []*clientv3.Event, epoch uint64) {
	src, _, _ := l.sourceOf(w)
	l.q.know.events(src, epoch, events, 0)
}
