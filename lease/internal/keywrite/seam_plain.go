//go:build !leasefence_mutants

package keywrite

import clientv3 "go.etcd.io/etcd/client/v3"

// Seam is empty in release builds: every write keeps its guard.
// seam_mutants.go has the write model's deliberate bugs.
type Seam struct{}

func (Seam) unguardedWithdraw() bool { return false }
func (Seam) adoptsOnlyHigher() bool  { return false }
func (Seam) markerOnlyAsRead() bool  { return false }
func (Seam) ownsAnyLeaseKey() bool   { return false }

func (w *Writes) unguardedWithdraw() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	return nil, nil, nil
}
