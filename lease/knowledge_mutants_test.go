//go:build leasefence_mutants

package lease

import "testing"

// Each deliberate bug in the grant rule must make the explorer fail.
func TestGrantRuleExplorerCatchesMutants(t *testing.T) {
	for _, m := range []struct {
		name     string
		mutation grantMutation
	}{
		{"watch vouches before its start", grantIgnoresStart},
		{"grant without the own key past the snapshot", grantIgnoresOwn},
	} {
		t.Run(m.name, func(t *testing.T) {
			_, err := explore(20000, 60, func(k *knowledge) { k.seam.mutation = m.mutation })
			if err == nil {
				t.Fatalf("the explorer did not catch %q in 20000 runs", m.name)
			}
			t.Logf("caught: %.200s", err)
		})
	}
}
