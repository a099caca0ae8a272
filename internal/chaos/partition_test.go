package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/chaos/netlab"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// cutFigures are what one cut of a lock holder measured.
type cutFigures struct {
	loss, expiry, successorWrite time.Duration // from the cut
	cutAccepted                  int           // holder's writes started after the cut and accepted
	staleAccepted                int           // ... started after the successor's first write and accepted
	lateRefused                  int           // holder's writes after the heal, refused by the fence
	locks                        string        // the lock oracle's fields (lockVerdict)
}

func (f cutFigures) String() string {
	return fmt.Sprintf("stale-accepted=%d accepted-after-cut=%d late-refused=%d cut→local-loss=%v cut→expiry=%v cut→successor-write=%v %s",
		f.staleAccepted, f.cutAccepted, f.lateRefused,
		f.loss.Round(time.Millisecond), f.expiry.Round(time.Millisecond), f.successorWrite.Round(time.Millisecond), f.locks)
}

// holderCut is the scenario shared by the minority partition and the
// delayed client link. A writer process holds the lock through
// holderMembers and writes a fenced register in a loop; a successor process
// waits through successorMembers. cut separates the holder. The holder must
// report its loss locally before the majority expires its lease, the
// successor must take over and write, nothing the holder started after the
// cut may be accepted, and after heal its late writes must be refused.
func holderCut(t *testing.T, ctx context.Context, lc *labCluster, holderMembers, successorMembers []*netlab.Host,
	cut func(holder *netlab.Host) error) cutFigures {
	t.Helper()
	q := lc.queueTwo(t, ctx, ttl, holderMembers, successorMembers)
	name, obs, holderHost, holder, successor, token := q.name, q.obs, q.holderHost, q.holder, q.waiter, q.token
	holderKey := fmt.Sprintf("%s/%x", name, leaseOfKey(t, ctx, obs, name, token))
	gone := keyGone(ctx, obs, holderKey)

	if err := cut(holderHost); err != nil {
		t.Fatal(err)
	}
	// The cut counts from when its last rule is in place: the rules take
	// some milliseconds to apply, and the holder writes on meanwhile.
	cutAt := time.Now()
	var f cutFigures
	lost, err := holder.await(ctx, cutAt, "LOST")
	if err != nil {
		t.Fatal(err)
	}
	f.loss = lost.at.Sub(cutAt)
	select {
	case at := <-gone:
		f.expiry = at.Sub(cutAt)
	case <-ctx.Done():
		t.Fatal("the holder's key never expired on the majority side")
	}
	if _, err := successor.await(ctx, cutAt, "LOCKED"); err != nil {
		t.Fatal(err)
	}
	first, err := successor.await(ctx, cutAt, "W 1 ok")
	if err != nil {
		t.Fatal(err)
	}
	f.successorWrite = first.at.Sub(cutAt)

	healAt := time.Now()
	if err := lc.lab.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := holder.awaitLine(wctx, healAt, "W n refused", func(s string) bool {
		return strings.HasPrefix(s, "W ") && strings.HasSuffix(s, " refused")
	}); err != nil {
		t.Errorf("no late write of the holder was refused by the fence after the heal: %v", err)
	}
	f.lateRefused = holder.count(healAt, time.Now(), "W ", " refused")
	f.cutAccepted = holder.acceptedStarted(cutAt, time.Now())
	f.staleAccepted = holder.acceptedStarted(first.at, time.Now())
	f.locks = lc.lockVerdict(t, ctx)
	t.Logf("%s (holder token %d)", f, token)
	if f.loss >= f.expiry {
		t.Errorf("local loss %v after the majority expired the lease (%v)", f.loss, f.expiry)
	}
	if f.cutAccepted != 0 {
		t.Errorf("%d writes the holder started after the cut were accepted", f.cutAccepted)
	}
	if f.staleAccepted != 0 {
		t.Errorf("%d writes the holder started after the successor's first write were accepted", f.staleAccepted)
	}
	return f
}

// twoInQueue is a writer process holding a lock and a second queued
// behind it, each on a host of its own, with a client on the observer.
type twoInQueue struct {
	name, reg              string
	obs                    *clientv3.Client // through the waiter's members
	holderHost, waiterHost *netlab.Host
	holder, waiter         *labChild
	token                  int64 // the holder's
}

// queueTwo starts the holder (through holderMembers), waits for its first
// accepted write, then starts the waiter (through waiterMembers) and waits
// until it is queued.
func (lc *labCluster) queueTwo(t *testing.T, ctx context.Context, sessionTTL time.Duration, holderMembers, waiterMembers []*netlab.Host) twoInQueue {
	t.Helper()
	q := twoInQueue{name: etcdproc.Name(t, "netlock"), reg: etcdproc.Name(t, "netreg"), obs: lc.client(t, lc.obs, waiterMembers...),
		holderHost: lc.host(t, ctx, "c0"), waiterHost: lc.host(t, ctx, "c1")}
	lc.watchLocks(t, ctx, q.name)
	q.holder = lc.startChild(t, ctx, q.holderHost, "writer", q.name, q.reg, sessionTTL, holderMembers...)
	locked, err := q.holder.await(ctx, time.Time{}, "LOCKED")
	if err != nil {
		t.Fatal(err)
	}
	q.token, _ = strconv.ParseInt(strings.TrimPrefix(locked.text, "LOCKED "), 10, 64)
	if _, err := q.holder.await(ctx, time.Time{}, "W 1 ok"); err != nil {
		t.Fatal(err)
	}
	q.waiter = lc.startChild(t, ctx, q.waiterHost, "writer", q.name, q.reg, sessionTTL, waiterMembers...)
	if err := waitQueuedKeys(ctx, q.obs, q.name, 2); err != nil {
		t.Fatal(err)
	}
	return q
}

// others are the members other than m.
func (lc *labCluster) others(m *netlab.Host) []*netlab.Host {
	var rest []*netlab.Host
	for _, x := range lc.members {
		if x != m {
			rest = append(rest, x)
		}
	}
	return rest
}

// leaseOfKey finds the lease of the queue key of name with token.
func leaseOfKey(t *testing.T, ctx context.Context, cli *clientv3.Client, name string, token int64) int64 {
	t.Helper()
	resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if kv.CreateRevision == token {
			return kv.Lease
		}
	}
	t.Fatalf("no key of %s with token %d", name, token)
	return 0
}

// keyGone reports when key is deleted.
func keyGone(ctx context.Context, cli *clientv3.Client, key string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	wch := cli.Watch(ctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	<-wch
	go func() { // ends with ctx
		for wr := range wch {
			if len(wr.Events) > 0 {
				ch <- time.Now()
				return
			}
		}
	}()
	return ch
}

// partitionSummary prints the partition tier's line for one scenario.
func partitionSummary(t *testing.T, scenario string, detail string) {
	summary(t, fmt.Sprintf("chaos partition tier: scenario=%s %s", scenario, detail))
}

// The holder on a minority member: its keep-alives fail, it reports the
// loss locally before the majority expires its lease, the successor on
// the majority side takes the lock and writes, and the holder's writes
// (none accepted without a quorum) are refused by the fence after the
// heal.
func TestPartitionMinorityHolder(t *testing.T) {
	ctx := etcdproc.Ctx(t, 3*time.Minute)
	lc := newLabCluster(t, ctx)
	_, followers := lc.leader(t, ctx)
	minority := followers[0]
	majority := lc.others(minority)
	f := holderCut(t, ctx, lc, []*netlab.Host{minority}, majority, func(holder *netlab.Host) error {
		rest := append(append([]*netlab.Host{}, majority...), lc.obs)
		return lc.lab.Partition(ctx, []*netlab.Host{minority, holder}, rest)
	})
	partitionSummary(t, "minority-holder", f.String())
}

// A client's link held for longer than the TTL, then healed: the network
// version of the SIGSTOP pause. TCP keeps what the holder sent and delivers
// it after the heal; the fence refuses it.
func TestPartitionClientLinkHeld(t *testing.T) {
	ctx := etcdproc.Ctx(t, 3*time.Minute)
	lc := newLabCluster(t, ctx)
	f := holderCut(t, ctx, lc, lc.members, lc.members, func(holder *netlab.Host) error {
		return lc.lab.Partition(ctx, []*netlab.Host{holder}, lc.members)
	})
	partitionSummary(t, "client-link-held", f.String())
}

// The holder on the majority side, a waiter on a minority member cut
// away for half the TTL: nothing changes for the holder, the waiter is
// never granted while cut off, and after the heal the queue is intact and
// hands over in order.
func TestPartitionMinorityWaiter(t *testing.T) {
	ctx := etcdproc.Ctx(t, 3*time.Minute)
	lc := newLabCluster(t, ctx)
	_, followers := lc.leader(t, ctx)
	minority := followers[0]
	majority := lc.others(minority)
	// The waiter's session outlives the cut: its last answered keep-alive
	// may have been sent a third of the TTL before the cut, and after the
	// heal the minority member has to rejoin and the client's connection
	// to resume (TCP retransmits back off while packets are dropped). With
	// a 4 s TTL that left as little as 0.67 s, and CI once saw the
	// waiter's session lost; 6 s leaves at least 2 s.
	const sessionTTL = 6 * time.Second
	const cutFor = 2 * time.Second
	q := lc.queueTwo(t, ctx, sessionTTL, majority, []*netlab.Host{minority})
	name, obs, holderHost, waiterHost, holder, waiter, token := q.name, lc.client(t, lc.obs, majority...), q.holderHost, q.waiterHost, q.holder, q.waiter, q.token
	cutAt := time.Now()
	if err := lc.lab.Partition(ctx, []*netlab.Host{minority, waiterHost}, append(append([]*netlab.Host{}, majority...), holderHost, lc.obs)); err != nil {
		t.Fatal(err)
	}
	select { // the fault's length, not a stand-in for an event
	case <-time.After(cutFor):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	healAt := time.Now()
	holderWrites := holder.acceptedStarted(cutAt, healAt)
	holderLost := holder.count(cutAt, healAt, "LOST", "")
	waiterGranted := waiter.count(cutAt, healAt, "LOCKED", "")
	if err := lc.lab.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := obs.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 2 || resp.Kvs[0].CreateRevision != token {
		t.Fatalf("queue after the heal: %d keys, first token %d; want the holder's %d and the waiter's", len(resp.Kvs), resp.Kvs[0].CreateRevision, token)
	}
	holder.Quit(10 * time.Second) // lets go: the child closes its session
	next, err := waiter.await(ctx, healAt, "LOCKED")
	if err != nil {
		t.Fatal(err)
	}
	nextToken, _ := strconv.ParseInt(strings.TrimPrefix(next.text, "LOCKED "), 10, 64)
	if _, err := waiter.await(ctx, next.at, "W 1 ok"); err != nil {
		t.Fatal(err)
	}
	t.Logf("during the cut: holder wrote %d times, lost %d, waiter granted %d; after: waiter token %d > %d",
		holderWrites, holderLost, waiterGranted, nextToken, token)
	switch {
	case holderWrites == 0:
		t.Error("the holder on the majority side wrote nothing during the cut")
	case holderLost != 0:
		t.Error("the holder on the majority side lost its lock")
	case waiterGranted != 0:
		t.Error("the cut-off waiter was granted")
	case nextToken <= token:
		t.Errorf("the waiter's token %d is not above the holder's %d", nextToken, token)
	}
	partitionSummary(t, "minority-waiter", fmt.Sprintf("stale-accepted=0 holder-writes-during-cut=%d waiter-granted-during-cut=%d handover-after-heal=ok %s",
		holderWrites, waiterGranted, lc.lockVerdict(t, ctx)))
}

// The leader cut off from both followers while a lock is held and written
// through it: a new leader, writes resume (the holder's, or its
// successor's if the holder's lease went with the old leader), tokens keep
// growing, and no acknowledged fenced write is lost.
func TestPartitionLeaderIsolated(t *testing.T) {
	ctx := etcdproc.Ctx(t, 3*time.Minute)
	lc := newLabCluster(t, ctx)
	leader, followers := lc.leader(t, ctx)
	name, reg := etcdproc.Name(t, "netlock"), etcdproc.Name(t, "netreg")
	obs := lc.client(t, lc.obs, followers...)
	lc.watchLocks(t, ctx, name)
	all := append([]*netlab.Host{leader}, followers...) // the leader first
	holder := lc.startChild(t, ctx, lc.host(t, ctx, "c0"), "writer", name, reg, ttl, all...)
	if _, err := holder.await(ctx, time.Time{}, "W 1 ok"); err != nil {
		t.Fatal(err)
	}
	successor := lc.startChild(t, ctx, lc.host(t, ctx, "c1"), "writer", name, reg, ttl, followers...)
	if err := waitQueuedKeys(ctx, obs, name, 2); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	if err := lc.lab.Partition(ctx, []*netlab.Host{leader}, followers); err != nil {
		t.Fatal(err)
	}
	elected, err := newLeader(ctx, obs, followers)
	if err != nil {
		t.Fatal(err)
	}
	// Writes resume: an accepted write started after the new leader.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var resumedAt time.Time
	for resumedAt.IsZero() {
		hc, sc := holder.changes(), successor.changes()
		for _, c := range []*labChild{holder, successor} {
			if n, at := c.accepted(elected, time.Now()); n > 0 && (resumedAt.IsZero() || at.Before(resumedAt)) {
				resumedAt = at
			}
		}
		if !resumedAt.IsZero() {
			break
		}
		select {
		case <-hc:
		case <-sc:
		case <-wctx.Done():
			t.Fatal("no fenced write accepted within 20s of the new leader")
		}
	}
	if err := lc.lab.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	holder.Quit(10 * time.Second)
	successor.Quit(10 * time.Second)
	// No acknowledged write lost: every write acknowledged to either
	// process is in the register's history. (The last value can be an
	// earlier write of the same holder whose outcome it was not told: a
	// proposal that reached etcd through the cut-off side and was applied
	// late. A fence orders holders, not one holder's own writes.)
	acked := ackedValues(holder, successor)
	history, err := valuesPut(ctx, obs, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range acked {
		if !history[v] {
			t.Errorf("acknowledged write %q is not in the register's history", v)
		}
	}
	lastToken, lastN := lastAcked(holder, successor)
	if g, err := obs.Get(ctx, reg); err == nil && len(g.Kvs) == 1 {
		if want := fmt.Sprintf("child-t%d-%d", lastToken, lastN); string(g.Kvs[0].Value) != want {
			var n int64
			fmt.Sscanf(string(g.Kvs[0].Value), "child-t%d-%d", new(int64), &n)
			t.Logf("the register ends at %q after %q was acknowledged; that write's own outcome: %q",
				g.Kvs[0].Value, want, holder.outcomeOf(n))
		}
	}
	// Tokens keep growing.
	s := session(t, ctx, obs, ttl)
	l := lock(t, ctx, s, name)
	lc.oracle.Granted(0, s, l)
	if l.Token() <= lastToken {
		t.Fatalf("token after the partition %d not above %d", l.Token(), lastToken)
	}
	l.Unlock(ctx)
	partitionSummary(t, "leader-isolated", fmt.Sprintf("stale-accepted=0 acknowledged=%d acknowledged-lost=0 cut→new-leader=%v cut→writes-resumed=%v %s",
		len(acked), elected.Sub(cutAt).Round(time.Millisecond), resumedAt.Sub(cutAt).Round(time.Millisecond), lc.lockVerdict(t, ctx)))
}

// newLeader waits until a write through the given members succeeds, which
// needs a leader among them, and returns when it did.
func newLeader(ctx context.Context, cli *clientv3.Client, members []*netlab.Host) (time.Time, error) {
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(pctx, "leasefence-lab-probe", "x")
		cancel()
		if err == nil {
			return time.Now(), nil
		}
		if ctx.Err() != nil || i >= 30 {
			return time.Time{}, fmt.Errorf("no leader among %d members: %w", len(members), err)
		}
	}
}

// lastAcked is the highest (token, n) of a write acknowledged to any of
// the children.
func lastAcked(children ...*labChild) (token, n int64) {
	for _, c := range children {
		c.mu.Lock()
		var tok int64
		for _, l := range c.lines {
			if rest, ok := strings.CutPrefix(l.text, "LOCKED "); ok {
				tok, _ = strconv.ParseInt(rest, 10, 64)
			}
			if rest, ok := strings.CutPrefix(l.text, "W "); ok {
				if num, ok := strings.CutSuffix(rest, " ok"); ok {
					k, _ := strconv.ParseInt(num, 10, 64)
					if tok > token || (tok == token && k > n) {
						token, n = tok, k
					}
				}
			}
		}
		c.mu.Unlock()
	}
	return token, n
}

// Links between the clients' hosts and the members flap (cut and healed
// every few hundred milliseconds) while clients hand a lock around and
// write three fenced registers: porcupine finds no history in which a
// stale write counted, and once the flapping stops every client gets the
// lock again (no waiter stuck).
func TestPartitionFlapping(t *testing.T) {
	ctx := etcdproc.Ctx(t, 3*time.Minute)
	lc := newLabCluster(t, ctx)
	cfg := runConfig{seed: 1, clients: 4, names: 1, fenced: true, fault: faultFlap, prefix: etcdproc.Name(t, "flap")}
	cfg.sizeForLatency(0)
	cfg.db, cfg.sqlf = newSQL(t)
	h, ev := NewHistory(), newEvents()
	// The oracle watches from the observer, which the flapping never cuts
	// off; a member it cuts from the others ends the watch (it requires
	// a leader), which reopens on another.
	oracle, err := StartOracle(ctx, lc.client(t, lc.obs, lc.members...), cfg.prefix+"/lock/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(oracle.Stop)
	clients := make([]*chaosClient, cfg.clients)
	var hosts []*netlab.Host
	for i := range clients {
		host := lc.host(t, ctx, fmt.Sprintf("c%d", i))
		hosts = append(hosts, host)
		clients[i] = &chaosClient{id: i, cfg: &cfg, h: h, ev: ev, rng: rand.New(rand.NewPCG(cfg.seed, uint64(i))),
			cli: lc.client(t, host, lc.members...), oracle: oracle}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.loop(runCtx, &victimState{done: make(chan struct{})}, nil)
		}()
	}
	flaps := flap(ctx, lc, hosts, 6*time.Second, rand.New(rand.NewPCG(cfg.seed, 99)))
	if err := lc.lab.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	// Every client is granted again after the flapping.
	ev.mu.Lock()
	before := maps.Clone(ev.grants)
	ev.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	settled := ev.waitFor(sctx, func() bool {
		for i := range clients {
			if ev.grants[i] <= before[i] {
				return false
			}
		}
		return true
	})
	if !settled {
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	stop()
	wg.Wait()
	if !settled {
		t.Fatalf("a client was not granted within 30s after the flapping stopped: grants before %v, now %v", before, ev.grants)
	}
	orc := oracle.Finish(ctx)
	reportOracle(t, t.Name(), orc)
	check, _ := h.Check(20 * time.Second)
	ops := len(h.Operations())
	t.Logf("%d flaps, %d operations, check %v", flaps, ops, check)
	if check != porcupine.Ok {
		t.Fatalf("history check %v: a stale write counted, or the checker gave up", check)
	}
	partitionSummary(t, "flapping", fmt.Sprintf("stale-accepted=0 flaps=%d ops=%d check=%v stuck-waiters=0 grants=%d invalid-grants=%d oracle-inconclusive=%d oracle-controls=%d/%d",
		flaps, ops, check, orc.Grants, len(orc.Invalid), inconclusive(orc), orc.Flagged, orc.Forged))
}

// flap cuts and heals links between the clients' hosts and the members,
// and between members, every 100 to 400 ms, for d. It returns how many
// faults it made.
func flap(ctx context.Context, lc *labCluster, clients []*netlab.Host, d time.Duration, rng *rand.Rand) int {
	all := append(append([]*netlab.Host{}, clients...), lc.members...)
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; n++ {
		a, b := all[rng.IntN(len(all))], lc.members[rng.IntN(len(lc.members))]
		if a != b {
			if rng.IntN(3) == 0 {
				lc.lab.HealAll(ctx)
			} else {
				lc.lab.Cut(ctx, a, b)
				lc.lab.Cut(ctx, b, a)
			}
		}
		select {
		case <-time.After(time.Duration(100+rng.IntN(300)) * time.Millisecond): // the fault's rhythm
		case <-ctx.Done():
		}
	}
	return n
}

// ackedValues are the register values whose writes the children report
// acknowledged ("W n ok" under the token of their last "LOCKED").
func ackedValues(children ...*labChild) []string {
	var vals []string
	for _, c := range children {
		c.mu.Lock()
		var tok string
		for _, l := range c.lines {
			if rest, ok := strings.CutPrefix(l.text, "LOCKED "); ok {
				tok = rest
			}
			if rest, ok := strings.CutPrefix(l.text, "W "); ok {
				if num, ok := strings.CutSuffix(rest, " ok"); ok {
					vals = append(vals, "child-t"+tok+"-"+num)
				}
			}
		}
		c.mu.Unlock()
	}
	return vals
}

// valuesPut replays key's history (nothing is compacted in these tests)
// and returns every value it was ever given.
func valuesPut(ctx context.Context, cli *clientv3.Client, key string) (map[string]bool, error) {
	g, err := cli.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	if len(g.Kvs) == 0 {
		return seen, nil
	}
	last := g.Kvs[0].ModRevision
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(1)) {
		if err := wr.Err(); err != nil {
			return nil, err
		}
		for _, ev := range wr.Events {
			seen[string(ev.Kv.Value)] = true
			if ev.Kv.ModRevision >= last {
				return seen, nil
			}
		}
	}
	return nil, ctx.Err()
}
