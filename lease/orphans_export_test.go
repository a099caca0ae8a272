package lease

// OrphanSweep is how often a session with suspect keys reads them.
const OrphanSweep = orphanSweep

// SuspectOrphan makes s treat key as the key of one of its puts that had
// no definite answer, as if it had sent one (test-only).
func SuspectOrphan(s *Session, key string) { s.suspectOrphan(key) }
