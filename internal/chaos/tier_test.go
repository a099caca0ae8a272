package chaos

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasefence/leasefence/internal/chaos/rttlab"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
)

// envSummary names a file that each tier's summary line is also appended
// to, so that a run without -v (.ci/run) can print them.
const envSummary = "LEASEFENCE_CHAOS_SUMMARY"

func summary(t testing.TB, line string) {
	fmt.Println(line)
	if path := os.Getenv(envSummary); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("summary file: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintln(f, line)
	}
}

// envPools is how many three-member clusters and network labs the tier
// keeps (1 unless set): the runs that stop a leader or cut the network
// take one of them each, in turns, so that more of them let more such
// runs go at once (with go test -parallel).
const envPools = "LEASEFENCE_CHAOS_POOLS"

// TestChaos is scenarios 10 and 11: randomized chaos with every fault kind,
// fenced, then the unfenced control; one summary line for the tier. Runs
// go as many at a time as go test -parallel allows, except that runs on a
// three-member cluster, whose leader they stop, or on a network lab, take
// one of the pool's each.
func TestChaos(t *testing.T) {
	runs, long := chaosRuns(t)
	checkFaultsEnv(t)
	tier := "long"
	if !long {
		tier, runs = "fast", len(runFaults())
	}
	controls := max(2, runs/10)
	pools := chaosPools(t)
	threes := make(chan *etcdtest.Cluster, pools)
	nets := make(chan *chaosNet, pools)
	rtts := make(chan *rttlab.Lab, pools)
	for range pools {
		threes <- etcdtest.StartT(t, etcdtest.Config{Members: 3, TickMs: 50, ElectionMs: 500})
		if slices.Contains(runFaults(), faultNet) { // where namespaces can be made
			nets <- newChaosNet(t, etcdproc.Ctx(t, 2*time.Minute))
		}
		rtts <- startRTT(t)
	}
	versity := startVersity(t) // one for the tier; a bucket per run
	var sum tally
	t.Run("runs", func(t *testing.T) {
		for i := 0; i < runs+controls; i++ {
			cfg := runConfig{
				seed:    uint64(i + 1),
				clients: 8 + i%9,
				names:   2,
				fenced:  i < runs,
				fault:   runFaults()[i%len(runFaults())],
				prefix:  name(t, "chaos", i),
			}
			cfg.rhythm(i)
			mode := "fenced"
			if !cfg.fenced {
				mode = "control"
			}
			t.Run(fmt.Sprintf("%04d-%s-%s", i, mode, cfg.fault), func(t *testing.T) {
				t.Parallel()
				cfg.endpoints = etcd.Endpoints()
				switch cfg.fault {
				case faultLeader:
					three := <-threes
					defer func() { threes <- three }()
					cfg.cluster, cfg.endpoints = three, three.Endpoints()
				case faultNet:
					net := <-nets
					defer func() { nets <- net }()
					cfg.net, cfg.endpoints = net, endpoints(net.lc.members...)
				case faultRTT:
					lab := <-rtts
					defer func() { rtts <- lab }()
					cfg.rtt, cfg.endpoints, cfg.churn = lab, rttEndpoints(lab), &rttCounts{}
					defer func() { t.Log(cfg.churn) }()
				}
				cfg.db, cfg.sqlf = newSQL(t)
				cfg.objects = newObjects(t, versity, cfg.names)
				r := run(t, cfg)
				sum.add(cfg, r)
				reportRun(t, cfg, r)
			})
		}
	})
	summary(t, sum.line(tier))
	if sum.staleAccepted != 0 {
		t.Errorf("%d stale writes accepted", sum.staleAccepted)
	}
	if sum.violations == 0 {
		t.Errorf("the unfenced control found no violation in %d valid runs: the suite proves nothing", sum.controlRuns)
	}
	tierManifest(t, &sum)
	if sum.invalid*4 > sum.runs {
		t.Errorf("%d of %d runs invalid: the faults are not happening", sum.invalid, sum.runs)
	}
	tierOracle(t, &sum)
	tierLiveness(t, &sum)
	tierEnd(t, &sum.end)
}

// chaosPools is LEASEFENCE_CHAOS_POOLS, 1 unless set.
func chaosPools(t testing.TB) int {
	t.Helper()
	v := os.Getenv(envPools)
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 8 {
		t.Fatalf("%s=%q: want 1 to 8", envPools, v)
	}
	return n
}

// reportRun logs what a run measured and fails the test for what it
// found wrong: a fenced history the checker did not accept, an invalid
// grant, a stuck waiter, an end-of-run finding (control runs too: they
// leave out the fence, not the lock), or a checker that gave up.
func reportRun(t testing.TB, cfg runConfig, r runResult) {
	t.Helper()
	t.Logf("valid=%v %s ops=%d check=%s stale-accepted=%d of %d late writes; %s; illegal kinds %v",
		r.valid, r.why, r.ops, r.check, r.staleAccepted, r.lateWrites, r.manifest, slices.Sorted(maps.Keys(r.illegal)))
	if cfg.fenced {
		report(t, cfg, r)
	}
	label := fmt.Sprintf("run seed=%d fault=%s keeper=%v lock-delay=%v", cfg.seed, cfg.fault, cfg.keeper, cfg.lockDelay)
	reportOracle(t, label, r.oracle)
	reportLiveness(t, label, r.liveness)
	reportEnd(t, label, r.end)
	if r.check == porcupine.Unknown {
		t.Errorf("the checker gave up (Unknown), which counts as a failure")
	}
}

// rhythm sets run i's Keeper and lock delay.
func (r *runConfig) rhythm(i int) {
	// Two runs in three, each kind in turn, the clients use a
	// Keeper, but not with a scaled clock (a Keeper's timer runs
	// on the real one): half of all runs with the clock kinds.
	r.keeper = (i+i/len(runFaults()))%3 != 0 && r.fault != faultSlowClock && r.fault != faultFastClock
	if r.fault == faultLost {
		// Every other run of the kind: half, whatever the kinds.
		r.keeper = (i/len(runFaults()))%2 == 0
	}
	// Two runs in four, in a rhythm apart from the Keeper's, the
	// sessions wait out a lock delay after a loss: the delay's
	// path and its meeting with the Keeper (where a waiter once
	// hung) are checked by the liveness oracle too. Not with
	// latency: its round trips on top of the delay outlast the
	// victim's pause, and the run proves nothing.
	if (i/2)%2 == 0 && r.fault != faultLatency {
		r.lockDelay = time.Second
	}
}

// checkFaultsEnv refuses a LEASEFENCE_CHAOS_FAULTS that names a kind
// that does not exist, or leaves none this build and machine can make.
func checkFaultsEnv(t testing.TB) {
	t.Helper()
	v := os.Getenv(envFaults)
	if v == "" {
		return
	}
	for _, f := range strings.Split(v, ",") {
		if !slices.Contains(allFaults, fault(f)) {
			t.Fatalf("%s=%q: no fault kind %q (kinds: %v)", envFaults, v, f, allFaults)
		}
	}
	if len(runFaults()) == 0 {
		t.Fatalf("%s=%q: none of these kinds can run in this build or on this machine", envFaults, v)
	}
}

// tierManifest holds the manifest register to account: it took part
// (writes and reads, fenced and in the control), every read decoded, the
// victims' late commits were tried and refused, and the control's plain
// puts let some through and the checker found it on the manifest
// registers alone.
func tierManifest(t testing.TB, sum *tally) {
	t.Helper()
	f, c := sum.manifest, sum.controlManifest
	if f.writes == 0 || f.reads == 0 || c.writes == 0 || c.reads == 0 {
		t.Errorf("the manifest register took no part: fenced %s, control %s", f, c)
	}
	if n := f.badReads + c.badReads; n != 0 {
		t.Errorf("%d manifest reads found an object objectfence could not decode", n)
	}
	if f.late == 0 || f.lateAccepted != 0 {
		t.Errorf("late manifest commits: %d tried, %d accepted; want some tried, none accepted", f.late, f.lateAccepted)
	}
	if sum.controlRuns > 0 && sum.kindViolations[KindManifest] == 0 {
		t.Errorf("the unfenced control found no violation on the manifest register in %d valid runs (%s)", sum.controlRuns, c)
	}
}

// reportOracle fails the test for a run with an invalid grant, and logs
// why a run's oracle was inconclusive.
func reportOracle(t testing.TB, run string, o OracleResult) {
	t.Helper()
	for _, why := range o.Invalid {
		t.Errorf("%s: %s", run, why)
	}
	if o.Lost != nil {
		t.Logf("lock oracle inconclusive (%d grants unchecked): %v", o.Unproven, o.Lost)
	}
	t.Logf("lock oracle: %d grants checked (%d read holdings), %d invalid; %d of %d forged early grants flagged",
		o.Grants, o.Readers, len(o.Invalid), o.Flagged, o.Forged)
}

// reportLiveness fails the test for a run with a stuck waiter, naming it,
// and logs why a run's liveness oracle was inconclusive.
func reportLiveness(t testing.TB, run string, lv LivenessResult) {
	t.Helper()
	for _, why := range lv.Stuck {
		t.Errorf("%s: %s", run, why)
	}
	if lv.Lost != nil {
		t.Logf("liveness oracle inconclusive (%d calls unplaced): %v", lv.Unproven, lv.Lost)
	}
	t.Logf("liveness oracle: %d waiters whose turn came checked, %d stuck; the slowest in time used %.0f%% of its bound",
		lv.Checked, len(lv.Stuck), 100*lv.Closest)
}

// tierLiveness holds the tier's liveness oracle to account: no stuck
// waiter, few inconclusive runs, and some waiters checked at all.
func tierLiveness(t testing.TB, sum *tally) {
	t.Helper()
	if sum.stuckWaiters != 0 {
		t.Errorf("%d stuck waiters", sum.stuckWaiters)
	}
	if sum.livenessInconclusive*4 > sum.runs {
		t.Errorf("the liveness oracle was inconclusive in %d of %d runs", sum.livenessInconclusive, sum.runs)
	}
	if sum.waitsChecked == 0 {
		t.Errorf("the liveness oracle checked no waiter: it cannot fail")
	}
}

// inconclusive is 1 for a run whose oracle could not check every grant.
func inconclusive(o OracleResult) int {
	if o.Lost != nil {
		return 1
	}
	return 0
}

// tierOracle holds the tier's lock oracle to account: no invalid grant,
// few inconclusive runs, and every forged early grant flagged, with some
// forged at all (a tier in which no grant waited proves nothing).
func tierOracle(t testing.TB, sum *tally) {
	t.Helper()
	if sum.invalidGrants != 0 {
		t.Errorf("%d invalid grants", sum.invalidGrants)
	}
	if sum.inconclusive*4 > sum.runs {
		t.Errorf("the lock oracle was inconclusive in %d of %d runs: the history is not being kept", sum.inconclusive, sum.runs)
	}
	if sum.forged == 0 || sum.flagged != sum.forged {
		t.Errorf("the lock oracle flagged %d of %d grants forged as decided at their own put: it cannot fail", sum.flagged, sum.forged)
	}
}
