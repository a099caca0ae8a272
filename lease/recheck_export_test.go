package lease

import (
	"errors"
	"sync"
)

// FailRechecks makes the next n batches of s's held locks' reads of their
// keys (as their own-key watches come up) fail as they start, as a read
// etcd did not answer would; it returns how many it has failed so far.
// Call it before s takes a lock.
func FailRechecks(s *Session, n int) (failed func() int) {
	var mu sync.Mutex
	done := 0
	next := s.rechecks.Go
	s.rechecks.Go = func(f func()) error {
		mu.Lock()
		fail := done < n
		if fail {
			done++
		}
		mu.Unlock()
		if fail {
			return errors.New("injected: the read was not answered")
		}
		return next(f)
	}
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return done
	}
}

// RecheckBatches counts s's recheck batch goroutines (keyread.Batcher's
// sendAll): Idle is sent on each time one returns, its reads all
// answered. Call it before s takes a lock.
type RecheckBatches struct {
	mu      sync.Mutex
	running int
	Idle    chan struct{}
}

// TrackRecheckBatches wraps s's batch starts to count them in a
// RecheckBatches.
func TrackRecheckBatches(s *Session) *RecheckBatches {
	b := &RecheckBatches{Idle: make(chan struct{}, 1000)}
	next := s.rechecks.Go
	s.rechecks.Go = func(f func()) error {
		return next(func() {
			b.mu.Lock()
			b.running++
			b.mu.Unlock()
			f()
			b.mu.Lock()
			b.running--
			b.mu.Unlock()
			b.Idle <- struct{}{}
		})
	}
	return b
}
