package lease

import (
	"context"
	"testing"
)

// A lock that has ended is not subscribed again: finish has already taken
// it off, or will, and a Keeper's shared watch would keep it for good.
func TestEndedLockNotSubscribedAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	live, ended := &Lock{ctx: context.Background()}, &Lock{ctx: ctx}
	cancel()
	w := &keyWatch{}
	w.subscribe(live)
	w.subscribe(ended)
	if subs := w.subscribers(); len(subs) != 1 || subs[0] != live {
		t.Fatalf("subscribers = %v, want only the live lock", subs)
	}
}
