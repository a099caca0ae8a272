package watch

import (
	"context"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// lock is a Listener that only ends.
type lock struct{ ctx context.Context }

func (l *lock) Events(*Watch, queue.Source, []*mvccpb.Event, queue.Epoch) {}

func (l *lock) Up(context.Context, *Watch, queue.Source, queue.Epoch, int64) error { return nil }

func (l *lock) Down(queue.Source, queue.Epoch) {}

func (l *lock) Unsubscribed(*Watch) {}

func (l *lock) Done() <-chan struct{} { return l.ctx.Done() }

func (l *lock) Cause() error { return context.Cause(l.ctx) }

func (l *lock) SubscribeTo(*Watch) queue.Epoch { return 0 }

// A lock that has ended is not subscribed again: its end has already
// taken it off, or will, and a Keeper's shared watch would keep it for
// good.
func TestEndedLockNotSubscribedAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	live, ended := &lock{ctx: context.Background()}, &lock{ctx: ctx}
	cancel()
	w := &Watch{}
	serial := queue.Source(0)
	listen := func() queue.Source { serial++; return serial }
	w.Subscribe(live, false, listen)
	w.Subscribe(ended, false, listen)
	if subs := w.subscribers(true); len(subs) != 1 || subs[0].l != live {
		t.Fatalf("subscribers = %v, want only the live lock", subs)
	}
}
