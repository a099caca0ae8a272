//go:build !leasefence_mutants

package queue

// grantSeam is empty in release builds: the grant rule's checks are
// always the ones rule.go states. seams_mutants.go has the
// deliberate bugs the explorer must catch.
type grantSeam struct{}

func (grantSeam) ignoresStart() bool { return false }
func (grantSeam) ignoresOwn() bool   { return false }

// waiterSeam is empty in release builds: a waiter does what waiter.go
// says. seams_mutants.go has the deliberate bugs the explorer must catch.
type waiterSeam struct{}

func (waiterSeam) joinKeepsTrust() bool  { return false }
func (waiterSeam) dropsRefollow() bool   { return false }
func (waiterSeam) keepsFar() bool        { return false }
func (waiterSeam) skipsConfirmOwn() bool { return false }

func (waiterSeam) joinNeverRefuses() bool      { return false }
func (waiterSeam) joinIgnoresEpoch() bool      { return false }
func (waiterSeam) leaveKeepsMirrored() bool    { return false }
func (waiterSeam) copyEpoch(epoch Epoch) Epoch { return epoch }

// copySeam is empty in release builds: a copy wakes whom copy.go says.
type copySeam struct{}

func (copySeam) missesHead() bool { return false }
