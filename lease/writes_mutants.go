//go:build leasefence_mutants

package lease

import "github.com/leasefence/leasefence/lease/internal/keywrite"

// WriteMutation names a deliberate bug in the lock key's writes, one of
// issue 46's defects with its fix reverted (lease/internal/keywrite has
// each), for the write model (writes_model_test.go) to show that it
// catches it.
type WriteMutation = keywrite.Mutation

// The deliberate bugs; keywrite.Mutation's constants say what each does.
const (
	UnguardedWithdraw = keywrite.UnguardedWithdraw
	AdoptsOnlyHigher  = keywrite.AdoptsOnlyHigher
	OwnsAnyLeaseKey   = keywrite.OwnsAnyLeaseKey
	MarkerOnlyAsRead  = keywrite.MarkerOnlyAsRead
)

// WriteMutations lists them, for the model's test of each.
func WriteMutations() []WriteMutation { return keywrite.Mutations() }

// SetWriteMutation makes s's lock key writes carry m (the write model).
func SetWriteMutation(s *Session, m WriteMutation) { s.writes.Mutation = m }
