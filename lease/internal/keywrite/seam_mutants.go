//go:build leasefence_mutants

package keywrite

import clientv3 "go.etcd.io/etcd/client/v3"

// Seam carries a deliberate bug in the writes around the grant, one of
// issue 46's defects with its fix reverted, for the write model
// (lease/writes_model_test.go) to show that it catches it.
type Seam struct{ Mutation Mutation }

// Mutation names a deliberate bug in the lock key's writes.
type Mutation int

const (
	_ Mutation = iota // the plain writes
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

// Mutations lists them, for the model's test of each.
func Mutations() []Mutation {
	return []Mutation{UnguardedWithdraw, AdoptsOnlyHigher, OwnsAnyLeaseKey, MarkerOnlyAsRead}
}

func (m Mutation) String() string {
	return map[Mutation]string{
		UnguardedWithdraw: "withdrawal compares no marker",
		AdoptsOnlyHigher:  "marker taken as found only if higher",
		OwnsAnyLeaseKey:   "any key on the lease taken for the session's",
		MarkerOnlyAsRead:  "the marker's history not asked",
	}[m]
}

func (s Seam) unguardedWithdraw() bool { return s.Mutation == UnguardedWithdraw }
func (s Seam) adoptsOnlyHigher() bool  { return s.Mutation == AdoptsOnlyHigher }
func (s Seam) ownsAnyLeaseKey() bool   { return s.Mutation == OwnsAnyLeaseKey }
func (s Seam) markerOnlyAsRead() bool  { return s.Mutation == MarkerOnlyAsRead }

// unguardedWithdraw is the withdrawal before issue 46: it deleted a key on
// the session's lease whatever the marker said.
func (w *Writes) unguardedWithdraw() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	move := clientv3.OpPut(w.marker(), "", clientv3.WithLease(w.s.Lease()))
	return []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(w.key), "=", int64(w.s.Lease()))},
		[]clientv3.Op{clientv3.OpDelete(w.key), move}, []clientv3.Op{move}
}
