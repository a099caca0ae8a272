//go:build leasefence_mutants

package chaos

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// newSession is lease.NewSession with the run's mutant and clock, which
// under the leasefence_mutants tag are options of package lease.
func newSession(ctx context.Context, cli *clientv3.Client, opts ...lease.Option) (*lease.Session, error) {
	if h := seam.From(ctx); h != nil {
		if h.Mutant.InLease() {
			opts = append(opts, lease.WithMutant(h.Mutant))
		}
		if h.ClockRate > 0 {
			opts = append(opts, lease.WithClockRate(h.ClockRate))
		}
	}
	return lease.NewSession(ctx, cli, opts...)
}

// clockFaults: the scaled clock exists under this tag.
const clockFaults = true
