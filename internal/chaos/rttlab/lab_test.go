package rttlab

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestLabPutsPayTheirRoundTrips: on a three-member lab with 2.5 ms each
// way, a put through the leader pays at least the client's round trip and
// one to a follower (4 one-way delays); through a follower, also the hop
// to the leader and back (6).
func TestLabPutsPayTheirRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	oneWay := 2500 * time.Microsecond
	lab, err := Start(ctx, Config{Members: 3, Client: oneWay, Peer: oneWay, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	leader, err := lab.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % 3
	for _, tc := range []struct {
		name   string
		member int
		hops   int
	}{{"leader", leader, 4}, {"follower", follower, 6}} {
		cli, err := lab.Client(tc.member)
		if err != nil {
			t.Fatal(err)
		}
		var took []time.Duration
		for range 30 {
			start := time.Now()
			if _, err := cli.Put(ctx, "rttlab", "x"); err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		cli.Close()
		slices.Sort(took)
		floor := time.Duration(tc.hops) * oneWay
		t.Logf("put via the %s: min %v p50 %v (floor %v)", tc.name, took[0], took[len(took)/2], floor)
		if took[0] < floor {
			t.Errorf("put via the %s took %v, below its floor %v: a link is not delaying", tc.name, took[0], floor)
		}
		if p50 := took[len(took)/2]; p50 > floor+10*time.Millisecond {
			t.Errorf("put via the %s: p50 %v, far above its floor %v", tc.name, p50, floor)
		}
	}
}
