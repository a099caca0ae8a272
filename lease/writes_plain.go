//go:build !leasefence_mutants

package lease

import clientv3 "go.etcd.io/etcd/client/v3"

// writeSeam is empty in release builds: every write keeps its guard.
// writes_mutants.go has the write model's deliberate bugs.
type writeSeam struct{}

func (writeSeam) unguardedWithdraw() bool { return false }
func (writeSeam) adoptsOnlyHigher() bool  { return false }
func (writeSeam) markerOnlyAsRead() bool  { return false }
func (writeSeam) ownsAnyLeaseKey() bool   { return false }

func (w *keyWrites) unguardedWithdraw() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	return nil, nil, nil
}
