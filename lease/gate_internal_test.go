package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A name's gate is held by one lock at a time, and a turn is never lost:
// waiters that give up as the turn is handed to them hand it on. Goroutines
// take the gate, some with a deadline that ends as others leave; at every
// moment at most one holds it, every take that does not give up gets it,
// and at the end it is free with nobody queued.
func TestGateTurns(t *testing.T) {
	const takers, rounds = 8, 300
	g := &gate{}
	var holders, maxHolders, taken, gaveUp atomic.Int64
	var wg sync.WaitGroup
	for i := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if (i+r)%3 == 0 { // a waiter that gives up soon, often as it is handed the turn
					ctx, cancel = context.WithTimeout(ctx, time.Duration(r%5)*20*time.Microsecond)
				}
				took, handed := g.take(false)
				if !took {
					select {
					case <-handed:
						took = true
					case <-ctx.Done():
						if !g.withdraw(handed) {
							g.leave() // handed the turn as it gave up: hand it on
						}
					}
				}
				cancel()
				if !took {
					gaveUp.Add(1)
					continue
				}
				n := holders.Add(1)
				for m := maxHolders.Load(); n > m && !maxHolders.CompareAndSwap(m, n); m = maxHolders.Load() {
				}
				taken.Add(1)
				holders.Add(-1)
				g.leave()
			}
		}()
	}
	wg.Wait()
	if m := maxHolders.Load(); m != 1 {
		t.Fatalf("the gate was held by %d locks at once", m)
	}
	if got := taken.Load() + gaveUp.Load(); got != takers*rounds {
		t.Fatalf("%d takes ended, want %d", got, takers*rounds)
	}
	if took, _ := g.take(true); !took || g.waiting != nil {
		t.Fatalf("the gate is not free at the end: took %v, waiting %v", took, g.waiting)
	}
	g.leave()
	if took, _ := g.take(true); !took {
		t.Fatal("a try found the gate held after its only holder left")
	}
	if took, handed := g.take(true); took || handed != nil {
		t.Fatal("a try took a held gate, or queued")
	}
	t.Logf("%d takes, %d gave up", taken.Load(), gaveUp.Load())
}
