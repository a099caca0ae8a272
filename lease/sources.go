package lease

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// The lock's watches feed its rule (queue.Rule), each subscription as a
// source of its own, named by a serial the rule hands out. A lock starts
// and ends a subscription only here, telling the rule in the same step
// under l.mu, so the rule never trusts a watch the lock no longer hears.

// done is closed once the lock has ended, and cause says why (listener).
func (l *Lock) done() <-chan struct{} { return l.ctx.Done() }

func (l *Lock) cause() error { return context.Cause(l.ctx) }

// nudge wakes the waiter (listener): as wake does for news that may grant
// it, as poke does for any other.
func (l *Lock) nudge(grant bool) {
	if grant {
		l.wake()
		return
	}
	l.poke()
}

// rangeOf is what watch w covers: its keys (nil for the whole queue) and
// whether the own key is among them.
func (l *Lock) rangeOf(w *keyWatch) (keys []string, coversOwn bool) {
	switch w {
	case l.w.own:
		return []string{l.key}, true
	case l.w.queue:
		return nil, true
	}
	return []string{w.key}, false
}

// feed is watch w as lock l subscribes to it (queue.Feed).
type feed struct {
	l *Lock
	w *keyWatch
}

func (f feed) Range() ([]string, bool) { return f.l.rangeOf(f.w) }

func (f feed) Subscribe(viaCopy bool, listen func() queue.Source) (queue.Epoch, int64, queue.Source) {
	return f.w.subscribe(f.l, viaCopy, listen)
}

func (f feed) Unsubscribe() (queue.Source, bool) { return f.w.unsubscribe(f.l) }

// subscribeTo makes l a subscriber of w, unless it is one, and returns w's
// epoch. A new subscription to a watch that is up covers l from the
// revision after the last response it handed on. A response handed on
// after the subscription waits for l.mu, so it reaches the rule after the
// subscription is up.
func (l *Lock) subscribeTo(w *keyWatch) queue.Epoch {
	// Already a subscriber (a follow watch kept across reads): nothing to
	// do, and no feed to allocate.
	if epoch, ok := w.subscribed(l); ok {
		return epoch
	}
	l.mu.Lock()
	epoch, src := l.q.Subscribe(feed{l, w}, false)
	l.mu.Unlock()
	if src != 0 && epoch.Up() {
		l.poke() // a source came up: the rule may wait for it now
	}
	return epoch
}

// unsubscribed ends l's subscription to w, stopped for good, and the
// rule's trust in it (listener).
func (l *Lock) unsubscribed(w *keyWatch) {
	l.mu.Lock()
	l.q.Unsubscribe(feed{l, w})
	l.mu.Unlock()
	l.poke()
}

// up records that subscription src came up in epoch, delivering
// every change of w's range from start on, and wakes the waiter. As the
// own-key watch comes up a holder reads its key again (recheck), as a
// deletion while the watch was down went unseen; an error means that
// read failed.
func (l *Lock) up(ctx context.Context, w *keyWatch, src queue.Source, epoch queue.Epoch, start int64) error {
	l.mu.Lock()
	l.q.Rule.Up(src, epoch, start)
	l.mu.Unlock()
	l.poke()
	if w == l.w.own {
		return l.recheck(ctx)
	}
	return nil
}

// down records that subscription src went down, ending epoch-1,
// and wakes the waiter.
func (l *Lock) down(src queue.Source, epoch queue.Epoch) {
	l.mu.Lock()
	l.q.Rule.Down(src, epoch)
	l.mu.Unlock()
	l.poke()
}

// ownKV is the own key as a read that found it this holding's shows it.
// l.mu is held.
func (l *Lock) ownKV() *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(l.key), Value: []byte(l.hold.value), CreateRevision: l.token, ModRevision: l.token, Lease: int64(l.s.id)}
}

// feed hands the rule one response's events of subscription src.
// l.mu is held.
func (l *Lock) feed(src queue.Source, events []*clientv3.Event, epoch queue.Epoch) {
	// An alias of mvccpb.Event from etcd's client v3.7 on, a type of its
	// own before: converted one by one, for both.
	evs := make([]*mvccpb.Event, len(events))
	for i, ev := range events {
		evs[i] = (*mvccpb.Event)(ev)
	}
	l.q.Rule.Events(src, epoch, evs, 0)
}
