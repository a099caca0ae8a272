package lease

import "time"

// SchedLag is how much earlier than their deadlines renewers now end
// sessions, before the cap of a quarter of the TTL.
func SchedLag() time.Duration { return schedLag.get(time.Now()) }

// ResetSchedLag forgets the lateness measured so far, so that a test that
// loaded the machine leaves none to the tests after it.
func ResetSchedLag() {
	schedLag.mu.Lock()
	defer schedLag.mu.Unlock()
	schedLag.start, schedLag.cur, schedLag.prev = time.Time{}, 0, 0
}
