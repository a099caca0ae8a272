package lease

import "sync"

// RecheckBatches counts s's recheck batch goroutines (keyread.Batcher's
// sendAll): Idle is sent on each time one returns, its reads all
// answered. Call it before s takes a lock.
type RecheckBatches struct {
	mu      sync.Mutex
	running int
	Idle    chan struct{}
}

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
