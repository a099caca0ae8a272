//go:build leasefence_mutants

package lease

import "github.com/leasefence/leasefence/internal/seam"

// dropsWake tells whether the session runs with the fault suite's mutant
// that drops a waiter's wake-up after a watch delivery: the waiter then
// sleeps past its turn, which the chaos suite's liveness oracle must
// report. wake_plain.go has the release form.
func (t *tracker) dropsWake() bool { return t.s.seam.mutant == seam.DroppedWake }
