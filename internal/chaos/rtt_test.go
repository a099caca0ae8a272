package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/chaos/rttlab"
)

// The rtt-lab fault: three etcd processes behind links that delay every
// byte as a wire does (internal/chaos/rttlab), at round trips a deployment
// has. During the victim's pause the links change under the run: every link's
// delay is set anew, one member's peer link is cut (every connection to
// its peer port, the leader's or another's: the others hear nothing it
// sends and it misses their pipelined messages), or one member's client
// link is cut (every client on it loses it and fails over). One cut at a
// time, so that a quorum stays. All heal, and the delays go back, before
// the victim does.

// rttBase is the lab's one-way delay between runs: a round trip of 0.5 ms
// on every link, within a zone.
const rttBase = 250 * time.Microsecond

// startRTT starts a lab for the tier; the test's cleanup stops it.
func startRTT(t *testing.T) *rttlab.Lab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// As the tier's embedded three: a 500 ms election timeout, so that
	// etcd grants the runs' 1-second leases.
	l, err := rttlab.Start(ctx, rttlab.Config{Members: 3, Client: rttBase, Peer: rttBase, TickMs: 50, ElectionMs: 500})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// rttEndpoints are the lab's members as its clients reach them.
func rttEndpoints(l *rttlab.Lab) []string {
	eps := make([]string, 3)
	for i := range eps {
		eps[i] = l.Endpoint(i)
	}
	return eps
}

// rttSteps bounds the changes one pause makes; each lasts rttStep/4 plus
// up to rttStep, 100 to 500 ms.
const (
	rttSteps = 12
	rttStep  = 400 * time.Millisecond
)

// rttCounts are the changes a run's pause made to the lab.
type rttCounts struct{ delays, peerCuts, clientCuts atomic.Int64 }

func (c *rttCounts) String() string {
	return fmt.Sprintf("rtt-lab{delays=%d peer-cuts=%d client-cuts=%d}", c.delays.Load(), c.peerCuts.Load(), c.clientCuts.Load())
}

// rttChurn changes the lab's links until ctx ends or rttSteps are done,
// then heals every link and restores the base delay; it counts the
// changes into n. wg tracks it.
func rttChurn(ctx context.Context, l *rttlab.Lab, seed uint64, n *rttCounts, wg *sync.WaitGroup) {
	rng := rand.New(rand.NewPCG(seed, 11))
	wg.Add(1)
	go func() {
		defer wg.Done()
		var cut *rttlab.Link
		heal := func() {
			if cut != nil {
				cut.Heal()
				cut = nil
			}
		}
		defer func() {
			heal()
			l.SetDelay(rttBase, rttBase)
		}()
		for range rttSteps {
			heal()
			switch rng.IntN(3) {
			case 0: // 0.2 to 5 ms round trips, each kind of link its own
				l.SetDelay(rttDelay(rng), rttDelay(rng))
				n.delays.Add(1)
			case 1:
				cut = l.PeerLink(rttMember(ctx, l, rng))
				cut.Cut()
				n.peerCuts.Add(1)
			case 2:
				cut = l.ClientLink(rttMember(ctx, l, rng))
				cut.Cut()
				n.clientCuts.Add(1)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(rng.Int64N(int64(rttStep))) + rttStep/4):
			}
		}
	}()
}

// rttDelay is a one-way delay from 0.1 to 2.5 ms.
func rttDelay(rng *rand.Rand) time.Duration {
	return 100*time.Microsecond + time.Duration(rng.Int64N(int64(2400*time.Microsecond)))
}

// rttMember is the leader half the time, else any member.
func rttMember(ctx context.Context, l *rttlab.Lab, rng *rand.Rand) int {
	if rng.IntN(2) == 0 {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if i, err := l.Leader(lctx); err == nil {
			return i
		}
	}
	return rng.IntN(3)
}
