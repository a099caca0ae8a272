package lease

import (
	"context"
	"testing"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// A lock that has ended is not subscribed again: finish has already taken
// it off, or will, and a Keeper's shared watch would keep it for good.
func TestEndedLockNotSubscribedAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	live, ended := &tracker{ctx: context.Background()}, &tracker{ctx: ctx}
	cancel()
	w := &keyWatch{}
	serial := queue.Source(0)
	listen := func() queue.Source { serial++; return serial }
	w.subscribe(live, false, listen)
	w.subscribe(ended, false, listen)
	if subs := w.subscribers(true); len(subs) != 1 || subs[0].l != live {
		t.Fatalf("subscribers = %v, want only the live lock", subs)
	}
}
