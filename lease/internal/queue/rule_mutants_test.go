//go:build leasefence_mutants

package queue

import (
	"strings"
	"testing"
)

// Each deliberate bug in the grant rule must make the explorer fail. An
// ended subscription that still vouches is bug 1 of issue 35 with its fix
// reverted: in the Keeper's world, where only joining and leaving the
// copy end subscriptions, the explorer must find it as the hang it was,
// a waiter behind a free lock trusting a watch it no longer hears.
func TestGrantRuleExplorerCatchesMutants(t *testing.T) {
	const seeds = 20000
	for _, m := range []struct {
		name     string
		mutation grantMutation
		shape    worldShape
		want     string // what the failure must say; any failure if empty
	}{
		{"watch vouches before its start", grantIgnoresStart, worldShape{}, ""},
		{"grant without the own key past the snapshot", grantIgnoresOwn, worldShape{}, ""},
		{"an ended subscription still vouches", grantKeepsUnlistened, worldShape{}, ""},
		{"a Keeper's waiter trusts the watch it left for the copy", grantKeepsUnlistened, worldShape{keeper: true}, "hangs: the queue grants it"},
	} {
		t.Run(m.name, func(t *testing.T) {
			mutate := func(k *Rule) { k.seam.mutation = m.mutation }
			for seed := range uint64(seeds) {
				if w := run(seed, 60, mutate, m.shape); w.err != nil && strings.Contains(w.err.Error(), m.want) {
					t.Logf("caught: %.200s", w.err)
					return
				}
			}
			t.Fatalf("the explorer did not catch %q in %d runs", m.name, seeds)
		})
	}
}
