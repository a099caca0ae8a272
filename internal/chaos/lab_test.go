package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/chaos/netlab"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
)

// labCluster is three etcd members, each a real process on a host of its
// own in a netlab network, and an observer host through which the test
// process reaches them (it has no address on the lab).
type labCluster struct {
	lab     *netlab.Lab
	members []*netlab.Host
	obs     *netlab.Host
	procs   *etcdproc.ProcCluster
	// oracle, once watchLocks has started it, is told the grants of the
	// children started after.
	oracle   *Oracle
	children int
}

// newLabCluster builds the lab and starts the members, or skips the test
// where namespaces cannot be made (CI, which runs as root, must run it).
func newLabCluster(t *testing.T, ctx context.Context) *labCluster {
	t.Helper()
	if err := netlab.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must run the partition scenarios: %v", err)
		}
		t.Skip(err)
	}
	lab, err := netlab.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	lc := &labCluster{lab: lab}
	var hosts []etcdproc.ProcHost
	for i := 0; i < 3; i++ {
		h := lc.host(t, ctx, fmt.Sprintf("m%d", i))
		lc.members = append(lc.members, h)
		hosts = append(hosts, etcdproc.ProcHost{IP: h.IP, ClientPort: 2379, PeerPort: 2380, Wrap: h.Wrap()})
	}
	lc.obs = lc.host(t, ctx, "obs")
	dir := t.TempDir()
	bin, err := etcdproc.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lc.procs, err = etcdproc.StartProcessesOn(ctx, bin, dir, hosts, 50, 500, lc.clientFromObs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.procs.Close) // before the lab goes (cleanups run last first)
	return lc
}

func (lc *labCluster) host(t *testing.T, ctx context.Context, name string) *netlab.Host {
	t.Helper()
	h, err := lc.lab.AddHost(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// clientFromObs is a client whose connections start on the observer host.
func (lc *labCluster) clientFromObs(endpoints []string) (*clientv3.Client, error) {
	return etcdproc.NewClientVia(endpoints, lc.obs.DialContext)
}

// client is a client on host h: its connections start there.
func (lc *labCluster) client(t *testing.T, h *netlab.Host, members ...*netlab.Host) *clientv3.Client {
	t.Helper()
	cli, err := etcdproc.NewClientVia(endpoints(members...), h.DialContext)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func endpoints(members ...*netlab.Host) []string {
	var eps []string
	for _, m := range members {
		eps = append(eps, "http://"+m.IP+":2379")
	}
	return eps
}

// leader is the member host that leads, and the others.
func (lc *labCluster) leader(t *testing.T, ctx context.Context) (*netlab.Host, []*netlab.Host) {
	t.Helper()
	p, err := lc.procs.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var others []*netlab.Host
	var leader *netlab.Host
	for _, m := range lc.members {
		if strings.Contains(p.ClientURL, m.IP+":") {
			leader = m
		} else {
			others = append(others, m)
		}
	}
	return leader, others
}

// labChild is a lock-holding child process (runChild's roles) on a lab
// host of its own, talking to the given members; its output lines are
// kept with the time each arrived.
type labChild struct {
	*exampleenv.Child
	mu      sync.Mutex
	lines   []timedLine
	changed chan struct{}
	ended   bool // the child's output has ended: no line will come
	// grant is what the child reported of its lock (KEY line), for
	// oracle, which is told at its LOCKED line; nil oracle: none.
	grant  Grant
	oracle *Oracle
}

type timedLine struct {
	text string
	at   time.Time
}

func (lc *labCluster) startChild(t *testing.T, ctx context.Context, h *netlab.Host, role, lock, reg string, ttl time.Duration, members ...*netlab.Host) *labChild {
	t.Helper()
	c, err := exampleenv.StartChildIn(ctx, h.Wrap(), h.Name, role,
		envEndpoints+"="+strings.Join(endpoints(members...), ","), envLock+"="+lock,
		envRegister+"="+reg, envTTL+"="+ttl.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	lc.children++
	lch := &labChild{Child: c, changed: make(chan struct{}), oracle: lc.oracle, grant: Grant{Client: lc.children, Name: lock}}
	go lch.follow() // ends when the child's output does
	return lch
}

func (c *labChild) follow() {
	for line := range c.Child.Lines() {
		c.report(line)
		c.mu.Lock()
		c.lines = append(c.lines, timedLine{line, time.Now()})
		c.wake()
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.ended = true
	c.wake()
	c.mu.Unlock()
}

// report passes the child's grant to the oracle: the KEY line says its
// key and lease, the LOCKED line after it its token. Only follow calls it.
func (c *labChild) report(line string) {
	if c.oracle == nil {
		return
	}
	if rest, ok := strings.CutPrefix(line, "KEY "); ok {
		var leaseHex string
		fmt.Sscanf(rest, "%s %s", &c.grant.Key, &leaseHex)
		c.grant.Lease, _ = strconv.ParseInt(leaseHex, 16, 64)
	}
	if rest, ok := strings.CutPrefix(line, "LOCKED "); ok {
		c.grant.Token, _ = strconv.ParseInt(rest, 10, 64)
		c.oracle.GrantedAs(c.grant)
	}
}

// watchLocks starts the lock oracle on the keys of lock name, from the
// observer through every member (a member the scenario cuts from the
// others ends the watch, which reopens on another); the children started
// after report their grants to it. The oracle watches every key starting
// with name, its sentinel among them, which is no key under name + "/".
func (lc *labCluster) watchLocks(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	o, err := StartOracle(ctx, lc.client(t, lc.obs, lc.members...), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Stop)
	lc.oracle = o
}

// lockVerdict checks the grants the oracle was told of, fails the test
// for an invalid one, and returns the summary's fields.
func (lc *labCluster) lockVerdict(t *testing.T, ctx context.Context) string {
	t.Helper()
	res := lc.oracle.Finish(ctx)
	reportOracle(t, t.Name(), res)
	return fmt.Sprintf("grants=%d invalid-grants=%d oracle-inconclusive=%d oracle-controls=%d/%d",
		res.Grants, len(res.Invalid), inconclusive(res), res.Flagged, res.Forged)
}

// wake tells the child's waiters that something changed; c.mu is held.
func (c *labChild) wake() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// await waits for the first line after since that starts with prefix.
func (c *labChild) await(ctx context.Context, since time.Time, prefix string) (timedLine, error) {
	return c.awaitLine(ctx, since, prefix, func(s string) bool { return strings.HasPrefix(s, prefix) })
}

// awaitLine waits for the first line after since that match accepts;
// what names it in the error.
func (c *labChild) awaitLine(ctx context.Context, since time.Time, what string, match func(string) bool) (timedLine, error) {
	for {
		c.mu.Lock()
		changed := c.changed
		for _, l := range c.lines {
			if !l.at.Before(since) && match(l.text) {
				c.mu.Unlock()
				return l, nil
			}
		}
		ended := c.ended
		c.mu.Unlock()
		if ended {
			// Fail now rather than wait out ctx for a line that cannot come.
			return timedLine{}, fmt.Errorf("%s: no %q line: its output ended\n%s", c.Name, what, c.Stderr())
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return timedLine{}, fmt.Errorf("%s: no %q line: %w\n%s", c.Name, what, ctx.Err(), c.Stderr())
		}
	}
}

// count counts the lines between from and to that start with prefix and
// end with suffix.
func (c *labChild) count(from, to time.Time, prefix, suffix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if !l.at.Before(from) && l.at.Before(to) && strings.HasPrefix(l.text, prefix) && strings.HasSuffix(l.text, suffix) {
			n++
		}
	}
	return n
}

// acceptedStarted counts the writes that started (an "S n" line) between
// from and to and were accepted ("W n ok").
func (c *labChild) acceptedStarted(from, to time.Time) int {
	n, _ := c.accepted(from, to)
	return n
}

// accepted counts the writes that started between from and to and were
// accepted, and says when the first acceptance came.
func (c *labChild) accepted(from, to time.Time) (n int, first time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	started := map[string]bool{}
	for _, l := range c.lines {
		if num, ok := strings.CutPrefix(l.text, "S "); ok && !l.at.Before(from) && l.at.Before(to) {
			started[num] = true
		}
		if rest, ok := strings.CutPrefix(l.text, "W "); ok {
			if num, ok := strings.CutSuffix(rest, " ok"); ok && started[num] {
				if n++; n == 1 {
					first = l.at
				}
			}
		}
	}
	return n, first
}

// changes is closed at the child's next output line.
func (c *labChild) changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// outcomeOf is the "W n ..." line of write n, if any.
func (c *labChild) outcomeOf(n int64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	prefix := fmt.Sprintf("W %d ", n)
	for _, l := range c.lines {
		if strings.HasPrefix(l.text, prefix) {
			return l.text
		}
	}
	return "none"
}

// chaosNet is the lab the chaos tier's network runs share: three members
// and a host per client, built once, taken in turns.
type chaosNet struct {
	lc      *labCluster
	clients []*netlab.Host
}

// maxClients is the most clients a chaos run has.
const maxClients = 16

func newChaosNet(t *testing.T, ctx context.Context) *chaosNet {
	t.Helper()
	lc := newLabCluster(t, ctx)
	n := &chaosNet{lc: lc}
	for i := 0; i < maxClients; i++ {
		n.clients = append(n.clients, lc.host(t, ctx, fmt.Sprintf("c%d", i)))
	}
	return n
}

// cut is the victim's pause on the network: its host is cut from every
// member, both ways; in two runs of three a member is also cut from the
// other two at the same time, the leader or another (an isolated leader,
// a minority partition). HealAll ends it. It returns the members that
// stay together.
func (n *chaosNet) cut(ctx context.Context, victim *netlab.Host, rng *rand.Rand) (together []*netlab.Host) {
	n.lc.lab.Partition(ctx, []*netlab.Host{victim}, n.lc.members)
	alone := -1
	switch rng.IntN(3) {
	case 1:
		alone = rng.IntN(len(n.lc.members))
	case 2:
		if p, err := n.lc.procs.Leader(ctx); err == nil {
			alone = slices.IndexFunc(n.lc.members, func(m *netlab.Host) bool { return strings.Contains(p.ClientURL, m.IP+":") })
		}
	}
	if alone < 0 {
		return n.lc.members
	}
	together = n.lc.others(n.lc.members[alone])
	n.lc.lab.Partition(ctx, []*netlab.Host{n.lc.members[alone]}, together)
	return together
}
