//go:build !leasefence_mutants

package lease

// dropsWake is false in release builds: every wake-up reaches its waiter.
// wake_mutants.go has the fault suite's mutant that drops one.
func (t *tracker) dropsWake() bool { return false }
