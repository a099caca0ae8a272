//go:build !leasefence_mutants

package queue

// grantSeam is empty in release builds: the grant rule's checks are
// always the ones rule.go states. seams_mutants.go has the
// deliberate bugs the explorer must catch.
type grantSeam struct{}

func (grantSeam) ignoresStart() bool    { return false }
func (grantSeam) ignoresOwn() bool      { return false }
func (grantSeam) keepsUnlistened() bool { return false }
