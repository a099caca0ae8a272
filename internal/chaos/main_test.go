package chaos

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
)

// etcd is the shared single member, with a short election timeout so that
// etcd grants 1-second leases and a run takes seconds, not tens of seconds.
var etcd = etcdtest.Env{IgnoreStoppedMembers: true}

var fastTiming = etcdtest.Config{TickMs: 50, ElectionMs: 500}

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(etcd.Main(m, fastTiming))
}

// envRuns is the switch for the long tier: the number of chaos runs.
const envRuns = "LEASEFENCE_CHAOS_RUNS"

// chaosRuns is how many fenced chaos runs this tier makes, and whether it
// is the long tier.
func chaosRuns(t testing.TB) (int, bool) {
	v := os.Getenv(envRuns)
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number of runs", envRuns, v)
	}
	return n, true
}

// repeat is how many times the fixed scenarios run: a few in the fast tier,
// more in the long one.
func repeat(t testing.TB, fast, long int) int {
	if _, isLong := chaosRuns(t); isLong {
		return long
	}
	return fast
}

func name(t testing.TB, base string, i int) string {
	return fmt.Sprintf("%s/%d", etcdproc.Name(t, base), i)
}
