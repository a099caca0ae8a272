//go:build !leasefence_mutants

package chaos

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// newSession is lease.NewSession. A run that asks for a mutant inside
// package lease or a scaled clock needs the leasefence_mutants build tag,
// and is refused here rather than run without it.
func newSession(ctx context.Context, cli *clientv3.Client, opts ...lease.Option) (*lease.Session, error) {
	if h := seam.From(ctx); h != nil && (h.Mutant.InLease() || h.ClockRate > 0) {
		return nil, fmt.Errorf("mutant %q or clock rate %v needs the build tag leasefence_mutants", h.Mutant, h.ClockRate)
	}
	return lease.NewSession(ctx, cli, opts...)
}

// clockFaults: without the tag the library's clock cannot be scaled, so the
// chaos runs leave out the clock fault kinds (CI runs them with the tag).
const clockFaults = false
