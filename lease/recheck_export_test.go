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
