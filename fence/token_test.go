package fence_test

import (
	"math"
	"testing"

	"github.com/leasefence/leasefence/fence"
)

func FuzzTokenOrder(f *testing.F) {
	for _, seed := range [][2]int64{{9, 10}, {0, 1}, {-1, 0}, {math.MinInt64, math.MaxInt64}, {255, 256}, {math.MaxInt64 - 1, math.MaxInt64}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b int64) {
		ea, eb := fence.EncodeToken(a), fence.EncodeToken(b)
		if len(ea) != 16 || len(eb) != 16 {
			t.Fatalf("widths %d, %d", len(ea), len(eb))
		}
		if (a < b) != (ea < eb) || (a == b) != (ea == eb) {
			t.Fatalf("order lost: %d→%s, %d→%s", a, ea, b, eb)
		}
		// The guard's "value <= token" comparison.
		if (a <= b) != (ea < eb+"\x00") {
			t.Fatalf("<= lost for %d, %d", a, b)
		}
		if got, err := fence.DecodeToken(ea); err != nil || got != a {
			t.Fatalf("round trip %d → %s → %d, %v", a, ea, got, err)
		}
	})
}

func TestDecodeTokenRejects(t *testing.T) {
	for _, s := range []string{"", "10", "zzzzzzzzzzzzzzzz", "800000000000000A", "80000000000000000"} {
		if _, err := fence.DecodeToken(s); err == nil {
			t.Errorf("DecodeToken(%q) accepted", s)
		}
	}
}
