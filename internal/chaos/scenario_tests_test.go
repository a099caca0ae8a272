package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
)

func plain(t *testing.T) context.Context { return etcdproc.Ctx(t, time.Minute) }

func TestScenarioTokens(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioTokens(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

func TestScenario1ProcessPause(t *testing.T) {
	n := repeat(t, 3, 30)
	rng := rand.New(rand.NewPCG(1, 1))
	successors := 0
	for i := 0; i < n; i++ {
		// From 0.5 to 3 TTLs; the first run always long enough to expire.
		pause := time.Duration(float64(ttl) * (0.5 + 2.5*rng.Float64()))
		if i == 0 {
			pause = 3 * ttl
		}
		t.Run(fmt.Sprintf("pause=%v", pause.Round(time.Millisecond)), func(t *testing.T) {
			etcdtest.LeakCheck(t)
			succ, err := scenarioProcessPause(t, plain(t), pause)
			if err != nil {
				t.Fatal(err)
			}
			if succ {
				successors++
			}
			t.Logf("successor took over during the pause: %v", succ)
		})
	}
	if successors == 0 {
		t.Error("no run's pause outlasted the lease: the scenario proved nothing")
	}
}

func TestScenario2HeldInFlight(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioHeldInFlight(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

func TestScenario3TokenReuse(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioTokenReuse(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

func TestScenario4UnlockAfterLoss(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioUnlockAfterLoss(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

// Scenario 5 runs on a member with etcd's default timing, where a 1-second
// request is granted 2 seconds.
func TestScenario5LossBeforeExpiry(t *testing.T) {
	c := etcdtest.StartT(t, etcdtest.Config{})
	cli := c.ClientT(t)
	latencies := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond}
	for i := 0; i < repeat(t, 1, 10); i++ {
		for _, lat := range latencies {
			t.Run(fmt.Sprintf("latency=%v", lat), func(t *testing.T) {
				margin, err := scenarioLossBeforeExpiry(t, plain(t), cli, c.Endpoints()[0], lat)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("local loss %v before etcd's expiry", margin)
			})
		}
	}
}

func TestScenario6Ambiguous(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioAmbiguous(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

func TestScenario7WaiterEnds(t *testing.T) {
	etcdtest.LeakCheck(t)
	if err := scenarioWaiterEnds(t, plain(t)); err != nil {
		t.Fatal(err)
	}
}

func TestScenario8LeaderStop(t *testing.T) {
	c := etcdtest.StartT(t, etcdtest.Config{Members: 3, TickMs: 50, ElectionMs: 500})
	for i := 0; i < repeat(t, 1, 5); i++ {
		if err := scenarioLeaderStop(t, plain(t), c); err != nil {
			t.Fatal(err)
		}
	}
}

// Scenario 9: p50 and p99 of the takeover time after SIGKILL, against the
// goal TTL + election timeout + 1 s.
func TestScenario9Takeover(t *testing.T) {
	var ds []time.Duration
	for i := 0; i < repeat(t, 3, 30); i++ {
		d, err := scenarioTakeover(t, plain(t))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	goal := ttl + 500*time.Millisecond + time.Second
	p50, p99 := percentile(ds, 0.5), percentile(ds, 0.99)
	summary(t, fmt.Sprintf("takeover after SIGKILL: runs=%d p50=%v p99=%v ttl=%v goal p99<=%v", len(ds), p50.Round(time.Millisecond), p99.Round(time.Millisecond), ttl, goal))
	if p99 > goal {
		t.Errorf("p99 takeover %v over the goal %v", p99, goal)
	}
}

func TestScenarioMinorityPartition(t *testing.T) {
	c := etcdtest.StartT(t, etcdtest.Config{Members: 3, TickMs: 50, ElectionMs: 500, PeerProxies: true})
	for i := 0; i < repeat(t, 1, 5); i++ {
		if err := scenarioMinorityPartition(t, plain(t), c); err != nil {
			t.Fatal(err)
		}
	}
}

// Scenario 8 with real etcd processes: the leader is killed with SIGKILL
// mid-run, then restarted on its data.
func TestScenario8LeaderKilled(t *testing.T) {
	ctx := plain(t)
	dir := t.TempDir()
	bin, err := etcdproc.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcdproc.StartProcesses(ctx, bin, dir, 3, 50, 500)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	newClient := func() *clientv3.Client {
		cli, err := etcdproc.NewClient(c.Endpoints())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	for i := 0; i < repeat(t, 1, 5); i++ {
		err := scenarioLeaderGone(t, ctx, newClient, func() func() {
			leader, err := c.Leader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			leader.Kill()
			return func() {
				if err := leader.Restart(ctx); err != nil {
					t.Errorf("restart: %v", err)
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
