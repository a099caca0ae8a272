//go:build leasefence_mutants

package lease

import clientv3 "go.etcd.io/etcd/client/v3"

// writeSeam carries a deliberate bug in the writes around the grant, one
// of issue 46's defects with its fix reverted, for the write model
// (writes_model_test.go) to show that it catches it.
type writeSeam struct{ mutation WriteMutation }

// WriteMutation names a deliberate bug in the lock key's writes.
type WriteMutation int

const (
	_ WriteMutation = iota // the plain writes
	// UnguardedWithdraw: the withdrawal deletes the key if it is on the
	// session's lease, comparing no marker (defects 1 and 4).
	UnguardedWithdraw
	// AdoptsOnlyHigher: a put that finds the marker not as the session
	// knew it takes it as found only if it moved up (defect 2).
	AdoptsOnlyHigher
	// OwnsAnyLeaseKey: any key at the lock's path on the session's lease
	// counts as the session's own put's (defect 4).
	OwnsAnyLeaseKey
	// MarkerOnlyAsRead: a key counts as the session's own put's only if
	// the marker as read says so, never from etcd's history (the review
	// of the fix: a marker deleted between a put's apply and its
	// withdrawal stranded the name).
	MarkerOnlyAsRead
)

// WriteMutations lists them, for the model's test of each.
func WriteMutations() []WriteMutation {
	return []WriteMutation{UnguardedWithdraw, AdoptsOnlyHigher, OwnsAnyLeaseKey, MarkerOnlyAsRead}
}

func (m WriteMutation) String() string {
	return map[WriteMutation]string{
		UnguardedWithdraw: "withdrawal compares no marker",
		AdoptsOnlyHigher:  "marker taken as found only if higher",
		OwnsAnyLeaseKey:   "any key on the lease taken for the session's",
		MarkerOnlyAsRead:  "the marker's history not asked",
	}[m]
}

// SetWriteMutation makes s's lock key writes carry m (the write model).
func SetWriteMutation(s *Session, m WriteMutation) { s.writes.mutation = m }

func (w writeSeam) unguardedWithdraw() bool { return w.mutation == UnguardedWithdraw }
func (w writeSeam) adoptsOnlyHigher() bool  { return w.mutation == AdoptsOnlyHigher }
func (w writeSeam) ownsAnyLeaseKey() bool   { return w.mutation == OwnsAnyLeaseKey }
func (w writeSeam) markerOnlyAsRead() bool  { return w.mutation == MarkerOnlyAsRead }

// unguardedWithdraw is the withdrawal before issue 46: it deleted a key on
// the session's lease whatever the marker said.
func (w *keyWrites) unguardedWithdraw() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	move := clientv3.OpPut(w.marker, "", clientv3.WithLease(w.s.id))
	return []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(w.key), "=", int64(w.s.id))},
		[]clientv3.Op{clientv3.OpDelete(w.key), move}, []clientv3.Op{move}
}
