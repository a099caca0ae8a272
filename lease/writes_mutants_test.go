//go:build leasefence_mutants

package lease_test

import (
	"testing"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Each of issue 46's defects, its fix reverted, must make the write model
// fail: a withdrawal that compares no marker deletes a later holding's
// key or the shared-lease Mutex's (defects 1 and 4), a marker taken as
// found only if higher strands the name once it is deleted (defect 2),
// and a key on the lease taken for the session's own deletes the Mutex's
// (defect 4).
func TestWriteModelCatchesMutants(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	const seeds = 400
	for _, m := range lease.WriteMutations() {
		t.Run(m.String(), func(t *testing.T) {
			for seed := range uint64(seeds) {
				err := runWrites(t, cli, seed, 14, func(s *lease.Session) { lease.SetWriteMutation(s, m) })
				if err != nil {
					t.Logf("caught at seed %d: %.300s", seed, err)
					return
				}
			}
			t.Fatalf("the write model did not catch %q in %d schedules", m, seeds)
		})
	}
}
