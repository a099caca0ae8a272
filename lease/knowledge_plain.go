//go:build !leasefence_mutants

package lease

// grantSeam is empty in release builds: the grant rule's checks are
// always the ones knowledge.go states. knowledge_mutants.go has the
// deliberate bugs the explorer must catch.
type grantSeam struct{}

func (grantSeam) ignoresStart() bool    { return false }
func (grantSeam) ignoresOwn() bool      { return false }
func (grantSeam) keepsUnlistened() bool { return false }
