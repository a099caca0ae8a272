package chaos

import (
	"fmt"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

// TestChaos is scenarios 10 and 11: randomized chaos with every fault kind,
// fenced, then the unfenced control; one summary line for the tier.
func TestChaos(t *testing.T) {
	runs, long := chaosRuns(t)
	tier := "long"
	if !long {
		tier, runs = "fast", len(allFaults)
	}
	controls := max(2, runs/10)
	var three *etcdtest.Cluster
	var sum tally
	for i := 0; i < runs+controls; i++ {
		cfg := runConfig{
			seed:    uint64(i + 1),
			clients: 8 + i%9,
			names:   2,
			fenced:  i < runs,
			fault:   allFaults[i%len(allFaults)],
			prefix:  name(t, "chaos", i),
		}
		cfg.endpoints = etcd.Endpoints()
		if cfg.fault == faultLeader {
			if three == nil {
				three = etcdtest.StartT(t, etcdtest.Config{Members: 3, TickMs: 50, ElectionMs: 500})
			}
			cfg.cluster, cfg.endpoints = three, three.Endpoints()
		}
		cfg.db, cfg.sqlf = newSQL(t)
		r := run(t, cfg)
		sum.add(cfg, r)
		if testing.Verbose() {
			t.Logf("run %d fenced=%v fault=%s clients=%d: valid=%v %s ops=%d check=%s stale=%d/%d",
				i, cfg.fenced, cfg.fault, cfg.clients, r.valid, r.why, r.ops, r.check, r.staleAccepted, r.lateWrites)
		}
		if cfg.fenced {
			report(t, cfg, r)
		}
		if r.check == porcupine.Unknown {
			t.Errorf("run %d: the checker gave up (Unknown), which counts as a failure", i)
		}
	}
	fmt.Println(sum.line(tier))
	if sum.staleAccepted != 0 {
		t.Errorf("%d stale writes accepted", sum.staleAccepted)
	}
	if sum.violations == 0 {
		t.Errorf("the unfenced control found no violation in %d valid runs: the suite proves nothing", sum.controlRuns)
	}
	if sum.invalid*4 > sum.runs {
		t.Errorf("%d of %d runs invalid: the faults are not happening", sum.invalid, sum.runs)
	}
}
