package lease

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefence/leasefence/lease/internal/queue"
	"github.com/leasefence/leasefence/lease/internal/watch"
)

// The lock's watches feed its rule (queue.Rule), each subscription as a
// source of its own, named by a serial the rule hands out. A lock starts
// and ends a subscription only here, telling the rule in the same step
// under t.mu, so the rule never trusts a watch the lock no longer hears.

// Done is closed once the lock has ended, and Cause says why
// (watch.Listener).
func (t *tracker) Done() <-chan struct{} { return t.end.done() }

func (t *tracker) Cause() error { return t.end.err() }

// nudge wakes the waiter (copyWaiter): as wake does for news that may
// grant it, as poke does for any other.
func (t *tracker) nudge(grant bool) {
	if grant {
		t.wake()
		return
	}
	t.poke()
}

// rangeOf is what watch w covers: its keys (nil for the whole queue) and
// whether the own key is among them.
func (t *tracker) rangeOf(w *watch.Watch) (keys []string, coversOwn bool) {
	switch w {
	case t.w.own:
		return []string{t.key}, true
	case t.w.q():
		return nil, true
	}
	return []string{w.Key()}, false
}

// feed is watch w as lock l subscribes to it (queue.Feed).
type feed struct {
	l *tracker
	w *watch.Watch
}

func (f feed) Range() ([]string, bool) { return f.l.rangeOf(f.w) }

func (f feed) Subscribe(viaCopy bool, listen func() queue.Source) (queue.Epoch, int64, queue.Source) {
	return f.w.Subscribe(f.l, viaCopy, listen)
}

func (f feed) Unsubscribe() (queue.Source, bool) { return f.w.Unsubscribe(f.l) }

// SubscribeTo makes l a subscriber of w, unless it is one, and returns w's
// epoch (watch.Listener). A new subscription to a watch that is up covers
// l from the revision after the last response it handed on. A response
// handed on after the subscription waits for t.mu, so it reaches the rule
// after the subscription is up.
func (t *tracker) SubscribeTo(w *watch.Watch) queue.Epoch {
	// Already a subscriber (a follow watch kept across reads): nothing to
	// do, and no feed to allocate.
	if epoch, ok := w.Subscribed(t); ok {
		return epoch
	}
	t.mu.Lock()
	if t.q == nil {
		t.mu.Unlock()
		return w.Epoch() // held: its key's events come through the watches it has
	}
	epoch, src := t.q.Subscribe(feed{t, w}, false)
	t.mu.Unlock()
	if src != 0 && epoch.Up() {
		t.poke() // a source came up: the rule may wait for it now
	}
	return epoch
}

// Unsubscribed ends l's subscription to w, stopped for good, and the
// rule's trust in it (watch.Listener).
func (t *tracker) Unsubscribed(w *watch.Watch) {
	t.mu.Lock()
	if t.q != nil {
		t.q.Unsubscribe(feed{t, w})
	} else {
		w.Unsubscribe(t)
	}
	t.mu.Unlock()
	t.poke()
}

// Up records that subscription src came up in epoch, delivering
// every change of w's range from start on, and wakes the waiter
// (watch.Listener). As the own-key watch comes up a holder reads its key
// again (recheck), as a deletion while the watch was down went unseen.
func (t *tracker) Up(_ context.Context, w *watch.Watch, src queue.Source, epoch queue.Epoch, start int64) error {
	t.mu.Lock()
	if t.q != nil {
		t.q.Rule.Up(src, epoch, start)
	}
	t.mu.Unlock()
	t.poke()
	if w == t.w.own {
		t.recheck(epoch)
	}
	return nil
}

// Down records that subscription src went down, ending epoch-1,
// and wakes the waiter (watch.Listener).
//
// A held lock whose own-key watch etcd refused (read permission on its
// key taken away, say) ends: it could no longer see its key deleted.
func (t *tracker) Down(src queue.Source, epoch queue.Epoch) {
	t.mu.Lock()
	if t.q != nil {
		t.q.Rule.Down(src, epoch)
	}
	if t.hold.granted && t.hold.phase == steady && t.end.err() == nil {
		if err := t.w.own.Refused(); err != nil && !t.w.own.Epoch().Up() {
			t.end.end(fmt.Errorf("%w: its key can no longer be watched: %w", ErrLost, err))
			t.l.finishLater()
		}
	}
	t.mu.Unlock()
	t.poke()
}

// ownKV is the own key as a read that found it this holding's shows it.
// t.mu is held.
func (t *tracker) ownKV() *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(t.key), Value: []byte(t.hold.value), CreateRevision: t.token, ModRevision: t.token, Lease: int64(t.s.id)}
}

// feed hands the rule one response's events of subscription src; once
// the lock is held, it judges its own key's events itself, as the rule
// does after the token (queue.EndsHolding). t.mu is held.
func (t *tracker) feed(src queue.Source, events []*mvccpb.Event, epoch queue.Epoch) {
	if t.q != nil {
		t.q.Rule.Events(src, epoch, events, 0)
		return
	}
	for _, ev := range events {
		if string(ev.Kv.Key) == t.key && queue.EndsHolding(t.token, t.owns, ev) {
			t.hold.keyEnded = true
		}
	}
}

// listen subscribes the lock to its watches, and has the rule read from
// where they start. A queue watch not started yet counts as down (epoch 0)
// until the lock starts it (queueWatch).
func (t *tracker) listen() {
	ownEpoch := t.SubscribeTo(t.w.own)
	var epoch queue.Epoch
	if q := t.w.q(); q != nil {
		epoch = t.SubscribeTo(q)
	}
	follows := t.w.fl().Subscribe(t)
	t.mu.Lock()
	t.q.Read(ownEpoch, epoch, follows, 0)
	t.mu.Unlock()
}

// stopListening ends the ended lock's subscriptions, its place on the
// Keeper's copy, and a pending start of its own-key watch.
func (t *tracker) stopListening() {
	t.mu.Lock()
	if t.hold.watchOwn != nil {
		t.hold.watchOwn.Stop()
	}
	token := t.token
	t.mu.Unlock()
	t.w.own.Unsubscribe(t)
	if q := t.w.q(); q != nil {
		q.Unsubscribe(t)
	}
	t.w.fl().Unsubscribe(t)
	if m := t.w.mirror(); m != nil {
		m.leave(t, token)
	}
}

// queueWatch is the name's queue watch, subscribed to: a session's own is
// started (paused) by the first lock of the name that needs it, and then
// kept by the name's gate for the locks after it (watches.setQueue). A
// lock that has ended by then may still start it, handing it to the gate;
// the watch does not take it back as a subscriber.
func (t *tracker) queueWatch() (*watch.Watch, error) {
	q := t.w.q()
	if q == nil {
		started, err := t.s.startWatch(t.name()+"/", true, true)
		if err != nil {
			return nil, err
		}
		if q = t.w.setQueue(started); q == nil {
			return nil, context.Cause(t.s.ctx) // the gate's watches stopped: the session ended
		}
	}
	t.SubscribeTo(q)
	return q, nil
}

// queueEpoch is the queue watch's epoch: 0 (down) before it is started.
func (t *tracker) queueEpoch() queue.Epoch {
	if q := t.w.q(); q != nil {
		return q.Epoch()
	}
	return 0
}
