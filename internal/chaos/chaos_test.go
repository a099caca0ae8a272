package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	_ "modernc.org/sqlite"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/chaos/netlab"
	"github.com/leasefence/leasefence/internal/chaos/rttlab"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/holdback"
	"github.com/leasefence/leasefence/internal/s3test"
	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// fault is the one fault of a run. Every run also pauses one lock holder
// (the victim) until its lease has expired and a successor has written;
// the fault is how the pause is made, or what else goes wrong meanwhile.
type fault string

const (
	faultPause     fault = "pause"          // the victim's traffic is held in the proxy, then released
	faultPartition fault = "partition"      // the victim's traffic is dropped (blackhole), its connections broken at the heal
	faultSlowClock fault = "clock-slow"     // as pause, with every session's clock at half speed
	faultFastClock fault = "clock-fast"     // as pause, with every session's clock at double speed
	faultLatency   fault = "latency"        // as pause, with 0-500 ms of latency on every client
	faultCompact   fault = "compact-defrag" // as pause, compacting and defragmenting throughout
	faultLeader    fault = "leader-stop"    // as pause, on three members, the leader stopped and restarted
	faultFlap      fault = "net-flap"       // network namespaces: links cut and healed every few hundred ms (partition_test.go)
	faultNet       fault = "net-partition"  // network namespaces: the victim's host cut from every member, sometimes with a member cut from the others
	faultRTT       fault = "rtt-lab"        // as partition, on three members behind delayed links, cut and slowed meanwhile (rtt_test.go)
	faultLost      fault = "lostanswers"    // as pause, with the lock clients' writes' answers lost, or the writes sent late (lostanswers_test.go)
)

var allFaults = []fault{faultPause, faultPartition, faultSlowClock, faultFastClock, faultLatency, faultCompact, faultLeader, faultNet, faultRTT, faultLost}

// envFaults names the fault kinds a tier runs, separated by commas
// (default: every kind this build and machine can make).
const envFaults = "LEASEFENCE_CHAOS_FAULTS"

// runFaults are the fault kinds this build and machine can make, of those
// LEASEFENCE_CHAOS_FAULTS names if set: the clock kinds need the
// leasefence_mutants build tag, the network kind network namespaces
// (root, ip, nft; CI must have them).
func runFaults() []fault {
	var fs []fault
	for _, f := range allFaults {
		switch {
		case (f == faultSlowClock || f == faultFastClock) && !clockFaults:
		case f == faultNet && netlab.Available() != nil && os.Getenv("CI") != "true":
		case !chosenFault(f):
		default:
			fs = append(fs, f)
		}
	}
	return fs
}

// chosenFault tells whether LEASEFENCE_CHAOS_FAULTS, if set, names f.
func chosenFault(f fault) bool {
	v := os.Getenv(envFaults)
	return v == "" || slices.Contains(strings.Split(v, ","), string(f))
}

// runConfig is one chaos run.
type runConfig struct {
	seed    uint64
	clients int
	names   int
	fenced  bool // false: the unfenced control
	fault   fault
	// keeper: each client renews its sessions through a lease.Keeper,
	// whose shared queue watch keeps a copy of the queue that the locks
	// take their view from instead of reading it.
	keeper bool
	// lockDelay: every session waits out this lock delay after a loss
	// (lease.WithLockDelay), so that the liveness oracle checks the
	// delay's path too; 0 for none.
	lockDelay time.Duration
	mutant    seam.Mutant
	// endpoints of the cluster; cluster is set when members can be stopped.
	endpoints []string
	cluster   *etcdtest.Cluster
	prefix    string
	db        *sql.DB
	sqlf      *sqlfence.Fence
	objects   *objects    // the manifest registers; nil: the run has none
	net       *chaosNet   // set for faultNet: members and clients on lab hosts
	rtt       *rttlab.Lab // set for faultRTT: members behind delayed links
	churn     *rttCounts  // ... and what its pause changed there
	// ttl is the clients' session TTL, and slack what their calls' timeouts
	// get on top of the usual: both grow with the latency a run injects.
	ttl, slack time.Duration
}

// sizeForLatency gives a run's sessions a TTL and its calls time for the
// latency on every client link. etcd's proxy holds each read from a
// connection for the latency before forwarding it and reads one at a time,
// so a message can wait for the one ahead of it: a one-way trip takes up to
// twice the latency, a round trip four times it. A session needs its first
// keep-alive answered within the TTL of the grant's send, two round trips
// after it, so the TTL is at least eight times the latency (and a whole
// number of seconds: etcd grants seconds). No lease-based lock lives
// through round trips longer than its TTL; this fault is about latency, not
// about lost sessions.
func (r *runConfig) sizeForLatency(latency time.Duration) {
	r.ttl, r.slack = time.Second, 4*latency
	if need := 8 * latency; need > r.ttl {
		r.ttl = need.Truncate(time.Second) + time.Second
	}
}

// runResult is what a run measured.
type runResult struct {
	valid         bool
	why           string // why the run is invalid
	ops           int
	check         porcupine.CheckResult
	info          porcupine.LinearizationInfo
	history       *History
	staleAccepted int // the victim's late writes that were accepted
	lateWrites    int
	oracle        OracleResult   // the lock oracle's verdict on every grant
	liveness      LivenessResult // the liveness oracle's on every call that may have waited
	// illegal holds the kinds whose registers' history alone the checker
	// finds illegal, in a run whose whole history it found illegal.
	illegal  map[string]bool
	manifest manifestCounts
	end      endResult // the end-of-run checks (lostanswers_test.go)
}

// manifestCounts are a run's operations on its manifest registers: writes
// by outcome, reads recorded, and the victim's late (stale) writes, with
// how many the store refused and how many it accepted.
type manifestCounts struct {
	writes                          int
	byOutcome                       [Failed + 1]int
	reads                           int
	late, lateRefused, lateAccepted int
	badReads                        int // reads of an object objectfence could not decode
}

func (m *manifestCounts) add(o manifestCounts) {
	m.writes += o.writes
	for i := range m.byOutcome {
		m.byOutcome[i] += o.byOutcome[i]
	}
	m.reads += o.reads
	m.late += o.late
	m.lateRefused += o.lateRefused
	m.lateAccepted += o.lateAccepted
	m.badReads += o.badReads
}

func (m manifestCounts) String() string {
	return fmt.Sprintf("manifest{writes=%d ok=%d refused=%d unknown=%d failed=%d reads=%d late=%d late-refused=%d late-accepted=%d}",
		m.writes, m.byOutcome[OK], m.byOutcome[Refused], m.byOutcome[Unknown], m.byOutcome[Failed], m.reads,
		m.late, m.lateRefused, m.lateAccepted)
}

// events lets clients and the victim wait for what others did: a grant of
// a name, an accepted write.
type events struct {
	mu      sync.Mutex
	changed chan struct{}
	granted map[string]int64 // name -> highest token granted
	wrote   map[string]int64 // name -> highest token of an accepted write to any of its registers
	regs    map[string]int64 // register -> highest token of an accepted write
	grants  map[int]int      // client -> locks granted to it
}

func newEvents() *events {
	return &events{changed: make(chan struct{}), granted: map[string]int64{}, wrote: map[string]int64{},
		regs: map[string]int64{}, grants: map[int]int{}}
}

// grantedTo counts a grant to client id.
func (e *events) grantedTo(id int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.grants[id]++
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *events) record(m map[string]int64, name string, token int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if token > m[name] {
		m[name] = token
	}
	close(e.changed)
	e.changed = make(chan struct{})
}

// highest is the highest token accepted by register reg so far.
func (e *events) highest(reg string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.regs[reg]
}

// waitFor waits until cond holds, checked after each event.
func (e *events) waitFor(ctx context.Context, cond func() bool) bool {
	for {
		e.mu.Lock()
		ok, ch := cond(), e.changed
		e.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// chaosClient is one client: its own etcd client, through its own proxies.
type chaosClient struct {
	id      int
	cfg     *runConfig
	h       *History
	ev      *events
	host    *netlab.Host // the client's host, for faultNet
	proxies []*etcdproc.Proxy
	// breakers are in front of the proxies, one each: see pause.
	breakers []*Breaker
	cli      *clientv3.Client
	rng      *rand.Rand
	seq      int
	oracle   *Oracle // told every grant
	// lockCli is the client the sessions (and a Keeper) use: cli, or in a
	// lostanswers run one of its own whose writes losses fault; the
	// fenced writes and reads go through cli, unfaulted.
	lockCli *clientv3.Client
	losses  *holdback.Losses
	// keep: the loop leaves its last session (and Keeper) open for the
	// end-of-run checks, and lets go of its last holding even after the
	// run's end; closeSession closes them.
	keep    bool
	session *lease.Session
	keeper  *lease.Keeper
	tools   *clientv3.Client // the run's own client, away from the faults; nil: none
	ends    *endLog          // keys lost while their lease lived
}

// hooks is the context the suite's own code sees: the run's mutant and
// clock, which newSession, seam.KV and seam.SQL turn into what the library
// is given.
func (r *runConfig) hooks(ctx context.Context) context.Context {
	h := &seam.Hooks{Mutant: r.mutant}
	switch r.fault {
	case faultSlowClock:
		h.ClockRate = 0.5
	case faultFastClock:
		h.ClockRate = 2
	}
	return seam.With(ctx, h)
}

func (r *runConfig) registers(name string) (held, res, row string) {
	return r.prefix + "/held/" + name, r.prefix + "/res/" + name, r.prefix + "/" + name
}

// register is the history's name for the register of kind under name.
func (r *runConfig) register(kind, name string) string {
	held, res, row := r.registers(name)
	switch kind {
	case KindHeld:
		return held
	case KindResource:
		return res
	case KindSQL:
		return "sql:" + row
	}
	return "s3:" + r.objects.bucket + "/" + manifestKey(name)
}

// kinds are the kinds of the run's registers: all four, or without the
// manifest when the run has no object store (the mutant and flapping
// runs).
func (r *runConfig) kinds() []string {
	if r.objects == nil {
		return []string{KindHeld, KindResource, KindSQL}
	}
	return allKinds
}

// objects are a run's manifest registers: a bucket of the run's own on the
// tier's versitygw, holding one manifest object per lock name, each
// committed through a Fence (one per name, shared by the clients: a Fence
// keeps no state but whether its store passed the condition check).
type objects struct {
	bucket   string
	store    objectfence.Store
	fences   map[string]*objectfence.Fence // by lock name
	badReads atomic.Int64                  // reads that found no manifest objectfence could decode
}

func manifestKey(name string) string { return "manifest/" + name }

// newObjects makes a run's manifest registers: a new bucket on srv, and a
// Fence for each of the run's lock names.
func newObjects(t testing.TB, srv *s3test.Server, names int) *objects {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bucket, err := srv.Bucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	o := &objects{bucket: bucket, store: store, fences: map[string]*objectfence.Fence{}}
	for i := range names {
		name := fmt.Sprint(i)
		if o.fences[name], err = objectfence.New(store, manifestKey(name), name); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// startVersity starts the tier's versitygw, stopped when t ends.
func startVersity(t testing.TB) *s3test.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a first build takes minutes
	defer cancel()
	srv, err := s3test.StartVersity(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// unfencedManifest is the manifest object the control puts, in the form
// objectfence wrote before manifests recorded their lock (JSON: the token,
// and the payload as base64), which it still reads: the Fence's Read,
// through which every manifest read goes, reads the control's writes as
// it reads its own commits (TestUnfencedManifest).
func unfencedManifest(token int64, payload string) []byte {
	b, _ := json.Marshal(struct {
		Token   int64  `json:"token"`
		Payload []byte `json:"payload"`
	}{token, []byte(payload)}) // cannot fail: fixed types
	return b
}

// write makes one write of the given kind with token, fenced or not, and
// records it. stale tells whether the register had already accepted a
// higher token when the write was sent.
func (c *chaosClient) write(ctx context.Context, kind, name string, l *lease.Lock, token int64) (out Outcome, stale bool) {
	_, res, row := c.cfg.registers(name)
	c.seq++
	val := fmt.Sprintf("c%d-t%d-%d", c.id, token, c.seq)
	reg := c.cfg.register(kind, name)
	in := Input{Register: reg, Kind: kind, Write: true, Token: token, Value: val}
	stale = c.ev.highest(reg) > token
	call := c.h.Now()
	wctx, cancel := context.WithTimeout(c.cfg.hooks(ctx), 2*time.Second+c.cfg.slack)
	defer cancel()
	var err error
	switch {
	case kind == KindManifest && c.cfg.fenced:
		// A holder claims, then commits on what the claim returned. The
		// claim is an operation of its own: it raises the token and keeps
		// the value. If it fails, no commit is sent.
		f := c.cfg.objects.fences[name]
		base, cerr := f.Claim(wctx, token)
		claim := Input{Register: reg, Kind: kind, Write: true, Token: token, Claim: true}
		if cerr != nil {
			o := c.outcome(kind, cerr)
			c.h.Add(c.id, claim, call, o)
			return o.Outcome, stale
		}
		c.h.Add(c.id, claim, call, Output{Outcome: OK})
		call = c.h.Now()
		_, err = f.Commit(wctx, base, []byte(val))
	case kind == KindManifest:
		// The control: a plain put of the manifest, through the same
		// store, over whatever the object holds.
		_, err = c.cfg.objects.store.Put(wctx, manifestKey(name), unfencedManifest(token, val), objectfence.Condition{})
	case kind == KindSQL && c.cfg.fenced:
		err = c.cfg.sqlf.Upsert(wctx, seam.SQL(wctx, c.cfg.db), row, token, sqlfence.Set("val", val))
	case kind == KindSQL:
		_, err = c.cfg.db.ExecContext(wctx, `INSERT INTO regs (id, val, fence_token) VALUES (?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET val = excluded.val, fence_token = excluded.fence_token`, row, val, token)
	case !c.cfg.fenced:
		_, err = c.cli.Put(wctx, reg, val)
	case kind == KindHeld:
		_, err = fence.NewTxn(wctx, c.cli, fence.Held(l)).Then(clientv3.OpPut(reg, val)).Commit()
	default:
		_, err = fence.NewTxn(wctx, c.cli, fence.Resource(res+".fence", token)).Then(clientv3.OpPut(reg, val)).Commit()
	}
	o := c.outcome(kind, err)
	if err == nil {
		c.ev.record(c.ev.regs, reg, token)
		c.ev.record(c.ev.wrote, name, token)
	}
	c.h.Add(c.id, in, call, o)
	return o.Outcome, stale
}

// outcome is what a write of kind that ended with err is in the model.
func (c *chaosClient) outcome(kind string, err error) Output {
	switch {
	case err == nil:
		return Output{Outcome: OK}
	case errors.Is(err, fence.ErrStale), errors.Is(err, fence.ErrNotHeld):
		return Output{Outcome: Refused}
	case kind == KindManifest && !errors.Is(err, fence.ErrOutcomeUnknown) &&
		(c.cfg.fenced || errors.Is(err, objectfence.ErrRefused)):
		// objectfence's word: only ErrOutcomeUnknown leaves a claim's or
		// a commit's outcome open; any other error (contended, refused by
		// the store, the read before the put failed, a commit whose base
		// was replaced) wrote nothing. The model holds it to that. The
		// control's plain put wrote nothing if the store refused it.
		return Output{Outcome: Failed}
	}
	return Output{Outcome: Unknown} // timed out or cut off: it may have been applied
}

// read reads one register, linearizably, and records it. Failed reads
// change nothing and are not recorded.
func (c *chaosClient) read(ctx context.Context, kind, name string) {
	held, res, row := c.cfg.registers(name)
	call := c.h.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Second+c.cfg.slack)
	defer cancel()
	var val, reg string
	switch kind {
	case KindManifest:
		reg = c.cfg.register(kind, name)
		m, err := c.cfg.objects.fences[name].Read(rctx)
		switch {
		case errors.Is(err, objectfence.ErrNotFound): // never written: ""
		case errors.Is(err, objectfence.ErrBadManifest):
			c.cfg.objects.badReads.Add(1)
			return
		case err != nil:
			return
		}
		val = string(m.Payload)
	case KindSQL:
		reg = "sql:" + row
		err := c.cfg.db.QueryRowContext(rctx, `SELECT val FROM regs WHERE id = ?`, row).Scan(&val)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return
		}
	default:
		reg = map[string]string{KindHeld: held, KindResource: res}[kind]
		resp, err := c.cli.Get(rctx, reg)
		if err != nil {
			return
		}
		if len(resp.Kvs) == 1 {
			val = string(resp.Kvs[0].Value)
		}
	}
	c.h.Add(c.id, Input{Register: reg, Kind: kind}, call, Output{Outcome: OK, Value: val})
}

var allKinds = []string{KindHeld, KindResource, KindSQL, KindManifest}

// victimState is shared between the clients: who became the victim and
// what the pause achieved.
type victimState struct {
	armed    atomic.Bool
	done     chan struct{}
	expired  atomic.Bool
	stale    atomic.Int64
	late     atomic.Int64
	succeded atomic.Bool
	// The late writes to the manifest register: stale, refused, accepted.
	manifestLate, manifestRefused, manifestAccepted atomic.Int64
	// heal: when the pause's faults healed, for the liveness oracle;
	// written by the victim's pause before done is closed.
	heal heal
}

// heal is when a run's faults healed: those on the victim's client alone
// (its links paused, blackholed or cut), and those on every client (a
// stopped leader, a member cut from the others, compaction), which count
// as healed once every member answers a linearizable read again. err is
// set when they did not within 10 s.
type heal struct {
	victim   int // the victim's client
	victimAt time.Time
	everyAt  time.Time // zero if the run's fault touches the victim alone
	err      error
}

// loop is a client's life: take a random lock, make a few random
// operations, let go; until ctx ends.
func (c *chaosClient) loop(ctx context.Context, v *victimState, watchCli *clientv3.Client) {
	var sopts []lease.Option
	if c.cfg.keeper {
		k, err := lease.NewKeeper(c.sessionClient())
		if err != nil {
			panic(err) // only a nil client is refused
		}
		c.keeper = k // closed after the session
		sopts = append(sopts, lease.WithKeeper(k))
	}
	if c.cfg.lockDelay > 0 {
		sopts = append(sopts, lease.WithLockDelay(c.cfg.lockDelay))
	}
	if !c.keep {
		defer c.closeSession()
	}
	for ctx.Err() == nil {
		s := c.liveSession(ctx, sopts)
		if s == nil {
			continue
		}
		name := fmt.Sprint(c.rng.IntN(c.cfg.names))
		l, err := c.acquire(ctx, s, name)
		if err != nil {
			continue
		}
		c.ev.record(c.ev.granted, name, l.Token())
		c.ev.grantedTo(c.id)
		for k := 1 + c.rng.IntN(4); k > 0 && ctx.Err() == nil; k-- {
			kinds := c.cfg.kinds()
			kind := kinds[c.rng.IntN(len(kinds))]
			if c.readNext(l) {
				c.read(ctx, kind, name)
				continue
			}
			c.write(ctx, kind, name, l, l.Token())
			if v.armed.CompareAndSwap(true, false) {
				c.pause(ctx, v, watchCli, name, l)
				break
			}
		}
		c.keyDeleted(s, l.Key(), l.Token(), l.Err()) // lost while held
		c.release(ctx, l)
	}
}

// sessionClient is the client the sessions use.
func (c *chaosClient) sessionClient() *clientv3.Client {
	if c.lockCli != nil {
		return c.lockCli
	}
	return c.cli
}

// liveSession is the client's session, a new one if it has none or it
// ended; nil if one could not be made.
func (c *chaosClient) liveSession(ctx context.Context, sopts []lease.Option) *lease.Session {
	if c.session != nil && c.session.Err() == nil {
		return c.session
	}
	if c.session != nil {
		c.session.Close()
		c.session = nil
	}
	// newSession, not lease.NewSession: the library never reads the
	// hooks from a context, so only newSession turns the run's clock
	// rate into the session's scaled clock.
	sctx, cancel := context.WithTimeout(c.cfg.hooks(ctx), 2*time.Second+c.cfg.slack)
	defer cancel()
	s, err := newSession(sctx, c.sessionClient(), append(sopts, lease.WithTTL(c.cfg.ttl))...)
	if err != nil {
		return nil
	}
	c.session = s
	return s
}

// closeSession closes the client's session, then its Keeper.
func (c *chaosClient) closeSession() {
	if c.session != nil {
		c.session.Close()
	}
	if c.keeper != nil {
		c.keeper.Close()
	}
}

// acquire takes the lock name on s in one of the ways a client can: Lock
// mostly, sometimes RLock (the holding then only reads), TryLock or
// TryRLock, so that the lock oracle checks grants of every kind, readers
// sharing and writers waiting behind them included. A refused try backs
// off a little rather than asking again at once. Every call goes to the
// liveness oracle too, granted or not. The call's timeout leaves room
// for the liveness bound past a turn (LivenessBound) and for a lock
// delay, so that a waiter sleeping past its turn is still waiting when
// its deadline passes.
func (c *chaosClient) acquire(ctx context.Context, s *lease.Session, name string) (*lease.Lock, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second+c.cfg.slack+2*c.cfg.lockDelay)
	defer cancel()
	how := []struct {
		op   string
		take func(context.Context, string) (*lease.Lock, error)
		mode lease.Mode
	}{{"RLock", s.RLock, lease.Read}, {"TryLock", s.TryLock, lease.Write}, {"TryRLock", s.TryRLock, lease.Read}}
	w := Wait{Client: c.id, Op: "Lock", Name: c.cfg.prefix + "/lock/" + name, Lease: int64(s.Lease()), Mode: lease.Write}
	take := s.Lock
	if i := c.rng.IntN(8); i < len(how) {
		w.Op, take, w.Mode = how[i].op, how[i].take, how[i].mode
	}
	w.Call = time.Now()
	l, err := take(lctx, w.Name)
	w.Return = time.Now()
	if err == nil && c.oracle != nil {
		c.oracle.Granted(c.id, s, l) // before anything else: see Granted
	}
	if c.oracle != nil {
		if err == nil {
			w.Token = l.Token()
		} else {
			w.Err, w.SessionLost = err.Error(), s.Err() != nil
		}
		c.oracle.Waited(ctx, w) // before the next call: see Waited
	}
	if errors.Is(err, lease.ErrLocked) {
		rest(ctx, time.Duration(10+c.rng.IntN(40))*time.Millisecond)
	}
	if err != nil && lctx.Err() == nil {
		c.keyDeleted(s, fmt.Sprintf("%s/%x", w.Name, w.Lease), 0, err) // lost while waiting
	}
	return l, err
}

// readNext tells whether the holding's next operation is a read: always
// for a read holding, one in three for a write holding.
func (c *chaosClient) readNext(l *lease.Lock) bool {
	return l.Mode() == lease.Read || c.rng.IntN(3) == 0
}

// release unlocks l, again while etcd's answer is missing (a timeout, a
// cut link) and the lock has not ended, until ctx ends: a client must not
// queue for the lock again while it may still hold it. Its next Lock would
// wait at its session's gate behind the lock it still holds, and every
// other client behind that lock's key, for as long as the session lives
// (a flapping run once stalled so).
func (c *chaosClient) release(ctx context.Context, l *lease.Lock) {
	if c.keep {
		// The session stays for the end-of-run checks: let go even as
		// the run ends, within a bound past its end, so that they find
		// no holder.
		var stop func()
		ctx, stop = pastEnd(ctx, 5*time.Second+c.cfg.slack)
		defer stop()
	}
	var errs []string
	for ctx.Err() == nil && l.Err() == nil {
		uctx, cancel := context.WithTimeout(ctx, time.Second+c.cfg.slack)
		err := l.Unlock(uctx)
		cancel()
		if err == nil {
			return
		}
		errs = append(errs, err.Error())
	}
	if c.ends != nil && len(errs) > 0 {
		c.ends.note(l.Key(), fmt.Sprintf("client %d: Unlock of %s (token %d) failed %d times, the lock ending with %v: %s",
			c.id, l.Key(), l.Token(), len(errs), l.Err(), strings.Join(errs, "; ")))
	}
}

// pastEnd is a context with ctx's values that ends d after ctx does,
// and a function that ends it at once.
func pastEnd(ctx context.Context, d time.Duration) (context.Context, func()) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-out.Done():
		}
	})
	return out, func() {
		stop()
		cancel()
	}
}

// pause is the victim's part: its traffic stops (held or dropped) until etcd
// has expired its lease and a successor has written under its lock (and,
// for up to a second more, until successors have written every one of the
// name's registers, so that each of its late writes is stale); then it
// comes back and, like a process waking from a pause, writes every register
// with its old token.
func (c *chaosClient) pause(ctx context.Context, v *victimState, watchCli *clientv3.Client, name string, l *lease.Lock) {
	defer close(v.done)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if c.cfg.net != nil {
		// Watch through members that stay together: a watch served by a
		// member the cut isolates would never see the expiry.
		together := c.cfg.net.cut(ctx, c.host, c.rng)
		wcli, err := c.cfg.net.lc.clientFromObs(endpoints(together...))
		if err == nil {
			defer wcli.Close()
			watchCli = wcli
		}
	}
	wch := watchCli.Watch(wctx, l.Key(), clientv3.WithRev(l.Token()+1))
	for _, p := range c.proxies {
		if c.cfg.dropsVictim() {
			p.BlackholeTx()
			p.BlackholeRx()
		} else {
			p.PauseTx()
			p.PauseRx()
		}
	}
	stopEnv := c.cfg.environment(ctx, c.rng.Uint64())
	// A successor after a loss waits out the lock delay, if any, first.
	bound, cancel := context.WithTimeout(ctx, 7*time.Second+c.cfg.ttl+2*c.cfg.lockDelay)
	defer cancel()
	expired := false
	for !expired {
		select {
		case wr, ok := <-wch:
			if !ok {
				expired = true // bound reached; checked below
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					expired = true
				}
			}
		case <-bound.Done():
			expired = true
		}
	}
	v.expired.Store(bound.Err() == nil)
	succeeded := c.ev.waitFor(bound, func() bool { return c.ev.wrote[name] > l.Token() })
	v.succeded.Store(succeeded)
	if succeeded {
		// Successors write registers of random kinds: the first write
		// covers one, the next few holdings (tens of milliseconds, unless
		// the run adds latency) the rest. A register still not written
		// after the second gets a late write that is not stale.
		all, cancelAll := context.WithTimeout(bound, time.Second)
		c.ev.waitFor(all, func() bool {
			for _, kind := range c.cfg.kinds() {
				if c.ev.regs[c.cfg.register(kind, name)] <= l.Token() {
					return false
				}
			}
			return true
		})
		cancelAll()
	}
	stopEnv()
	if c.cfg.net != nil {
		c.cfg.net.lc.lab.HealAll(ctx)
	}
	for i, p := range c.proxies {
		if c.cfg.dropsVictim() {
			// The connections that lived through the partition break (as
			// a real network's timeouts break them) before the blackholes
			// lift: no byte crosses a connection that lost some, and the
			// client dials again and resumes each watch from its last
			// revision. See Breaker.
			c.breakers[i].Break(func() {
				p.UnblackholeTx()
				p.UnblackholeRx()
			})
		} else {
			p.UnpauseTx()
			p.UnpauseRx()
		}
	}
	defer c.healed(ctx, v)()
	for _, kind := range c.cfg.kinds() {
		out, stale := c.write(ctx, kind, name, l, l.Token())
		if !stale {
			continue
		}
		v.late.Add(1)
		if out == OK {
			v.stale.Add(1)
		}
		if kind == KindManifest {
			v.manifestLate.Add(1)
			switch out {
			case OK:
				v.manifestAccepted.Add(1)
			case Refused:
				v.manifestRefused.Add(1)
			}
		}
	}
}

// healed records, as the victim's links come back, when the faults healed
// (heal), and returns a function that waits until those on every client
// have: until every member answers a linearizable read, checked beside
// the victim's late writes so as not to hold them up.
func (c *chaosClient) healed(ctx context.Context, v *victimState) (wait func()) {
	v.heal.victim, v.heal.victimAt = c.id, time.Now()
	if c.cfg.fault != faultLeader && c.cfg.fault != faultNet && c.cfg.fault != faultCompact && c.cfg.fault != faultRTT {
		return func() {} // the fault touched the victim's links alone
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.heal.err = whole(ctx, c.cfg.newClient(), c.cfg.endpoints)
		v.heal.everyAt = time.Now()
	}()
	return func() { <-done }
}

// newClient is how the run's own tools reach the members: straight, or
// for a network run from the observer host, which no cut isolates.
func (r *runConfig) newClient() func([]string) (*clientv3.Client, error) {
	if r.net != nil {
		return r.net.lc.clientFromObs
	}
	return etcdproc.NewClient
}

// whole waits until every member of endpoints answers a linearizable
// read (it is reachable and has a leader), for up to 10 s in all, and
// says which did not.
func whole(ctx context.Context, newClient func([]string) (*clientv3.Client, error), endpoints []string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, ep := range endpoints {
		cli, err := newClient([]string{ep})
		if err != nil {
			return fmt.Errorf("member %s: %w", ep, err)
		}
		err = answers(ctx, cli)
		cli.Close()
		if err != nil {
			return fmt.Errorf("member %s did not answer a linearizable read after the heal: %w", ep, err)
		}
	}
	return nil
}

// answers makes a linearizable read through cli, again after a failure,
// until one succeeds or ctx ends.
func answers(ctx context.Context, cli *clientv3.Client) error {
	for {
		rctx, stop := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "heal-probe")
		stop()
		if err == nil || ctx.Err() != nil {
			return err
		}
		rest(ctx, 50*time.Millisecond)
	}
}

// liveness is what the liveness oracle needs of the run: its bound, from
// the round trip its latency allows (slack is the longest); its session
// slack, a TTL on the sessions' clock (a slow one stretches it); its lock
// delay's lease as etcd grants it (whole seconds, at least etcd's
// minimum TTL, 1 s with the suite's 500 ms election timeout); when its
// faults healed; and its end.
func (r *runConfig) liveness(v *victimState, victimFound bool, end time.Time) Liveness {
	p := Liveness{Bound: LivenessBound(r.slack), SessionSlack: r.ttl, End: end}
	if r.fault == faultLost {
		p.Bound += LostAnswersAllowance(r.slack, lossesInWindow)
	}
	if r.fault == faultSlowClock {
		p.SessionSlack = 2 * r.ttl
	}
	if r.lockDelay > 0 {
		p.DelayTTL = max(time.Second, (r.lockDelay + time.Second - 1).Truncate(time.Second))
	}
	if victimFound {
		p.Healed, p.ClientHealed = v.heal.everyAt, map[int]time.Time{v.heal.victim: v.heal.victimAt}
	}
	if victimFound && v.heal.err != nil {
		p.Healed = end // when etcd was whole again is unknown: nothing falls due
	}
	return p
}

// dropsVictim tells whether the victim's traffic is dropped, not held:
// its connections then break as it heals.
func (r *runConfig) dropsVictim() bool { return r.fault == faultPartition || r.fault == faultRTT }

// environment starts what the run's fault adds around the pause and
// returns a function that ends it.
func (r *runConfig) environment(ctx context.Context, seed uint64) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	switch r.fault {
	case faultLeader:
		if ld := r.cluster.Leader(); ld != nil {
			ld.Stop()
			wg.Add(1)
			go func() { // restart once the others have moved on
				defer wg.Done()
				<-ctx.Done()
				rctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
				defer stop()
				ld.Restart(rctx)
			}()
		}
	case faultRTT:
		rttChurn(ctx, r.rtt, seed, r.churn, &wg)
	case faultCompact:
		cli, err := etcdproc.NewClient(r.endpoints)
		if err == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer cli.Close()
				for i := 0; i < 20 && ctx.Err() == nil; i++ { // bounded
					if g, err := cli.Get(ctx, "compact-probe"); err == nil {
						cli.Compact(ctx, g.Header.Revision)
						cli.Defragment(ctx, r.endpoints[0])
					}
					select {
					case <-time.After(200 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}()
		}
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// run makes one chaos run and checks its history.
func run(t testing.TB, cfg runConfig) runResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(cfg.seed, 7))
	h, ev := NewHistory(), newEvents()
	v := &victimState{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newClient := etcdproc.NewClient
	if cfg.net != nil {
		newClient = cfg.net.lc.clientFromObs
	}
	watchCli, err := newClient(cfg.endpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer watchCli.Close()
	oracle := startOracle(t, ctx, newClient, cfg)

	var latency time.Duration
	if cfg.fault == faultLatency {
		latency = time.Duration(rng.IntN(500)) * time.Millisecond
	}
	cfg.sizeForLatency(latency)
	ends := &endLog{}
	var closers []func() // in reverse at the end: each client's sessions first, then its etcd clients and proxies
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	clients := make([]*chaosClient, cfg.clients)
	for i := range clients {
		c := &chaosClient{id: i, cfg: &cfg, h: h, ev: ev, rng: rand.New(rand.NewPCG(cfg.seed, uint64(i))), oracle: oracle,
			tools: watchCli, ends: ends, keep: true}
		if err := c.connect(t, latency, &closers); err != nil {
			t.Fatal(err)
		}
		closers = append(closers, c.closeSession)
		clients[i] = c
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.loop(ctx, v, watchCli)
		}()
	}
	awaitVictim(ctx, v)
	victimFound := !v.armed.Load()
	end := time.Now() // a call not returned by now was still waiting
	cancel()
	wg.Wait()
	losses := stopLosses(clients) // every late write landed or failed

	res := runResult{history: h, ops: len(h.Operations()),
		staleAccepted: int(v.stale.Load()), lateWrites: int(v.late.Load()), oracle: oracle.Finish(ctx)}
	res.liveness = oracle.Liveness(cfg.liveness(v, victimFound, end))
	res.end = endChecks(clients, watchCli, ends, oracle)
	res.end.losses = losses
	if victimFound && v.heal.err != nil && res.liveness.Lost == nil {
		res.liveness.Lost = v.heal.err // heal times unknown: nothing is proven
	}
	res.judge(cfg, v, victimFound)
	return res
}

// awaitVictim lets the clients get going, then arms the fault (the next
// client to write under a lock becomes the victim), and waits for the
// victim's pause and a short tail, so that reads after its late writes
// happen, or for ctx's end.
func awaitVictim(ctx context.Context, v *victimState) {
	select {
	case <-time.After(150 * time.Millisecond):
	case <-ctx.Done():
	}
	v.armed.Store(true)
	select {
	case <-v.done:
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
}

// judge says whether the run proved anything, checks its history, and
// counts its manifest operations.
func (res *runResult) judge(cfg runConfig, v *victimState, victimFound bool) {
	h := res.history
	switch {
	case !victimFound:
		res.why = "no client became the victim"
	case !v.expired.Load():
		res.why = "the victim's lease never expired"
	case !v.succeded.Load():
		res.why = "no successor wrote while the victim was paused"
	default:
		res.valid = true
	}
	res.check, res.info = h.Check(20 * time.Second)
	if res.check == porcupine.Illegal {
		res.illegal = illegalKinds(h, cfg.kinds())
	}
	if cfg.objects != nil {
		res.manifest = countManifest(h)
		res.manifest.late = int(v.manifestLate.Load())
		res.manifest.lateRefused = int(v.manifestRefused.Load())
		res.manifest.lateAccepted = int(v.manifestAccepted.Load())
		res.manifest.badReads = int(cfg.objects.badReads.Load())
	}
}

// connect gives c its etcd clients: straight from its own host for a
// network run (the network is the fault), else through a proxy of its own
// to each member (a proxy's failures fail t), each behind a Breaker, with
// the run's latency; for a lostanswers run its sessions get a client of
// their own on the same links, whose writes' answers are lost or which
// sends them late (lostanswers_test.go). What it opens goes on closers.
func (c *chaosClient) connect(t testing.TB, latency time.Duration, closers *[]func()) error {
	cfg := c.cfg
	if cfg.net != nil {
		cli, err := etcdproc.NewClientVia(cfg.endpoints, cfg.net.clients[c.id].DialContext)
		if err != nil {
			return err
		}
		*closers = append(*closers, func() { cli.Close() })
		c.host, c.cli, c.lockCli = cfg.net.clients[c.id], cli, cli
		return nil
	}
	var urls []string
	for _, ep := range cfg.endpoints {
		p, url, err := etcdproc.NewProxy(t, "", ep)
		if err != nil {
			return err
		}
		*closers = append(*closers, p.Close)
		if latency > 0 {
			p.DelayTx(latency/2, latency/4)
			p.DelayRx(latency/2, latency/4)
		}
		// The client reaches the proxy through a Breaker, which a
		// partition's heal uses to break its connections.
		b, addr, err := NewBreaker(strings.TrimPrefix(url, "http://"))
		if err != nil {
			return err
		}
		*closers = append(*closers, func() { b.Close() })
		c.proxies = append(c.proxies, p)
		c.breakers = append(c.breakers, b)
		urls = append(urls, "http://"+addr)
	}
	cli, err := etcdproc.NewClient(urls)
	if err != nil {
		return err
	}
	*closers = append(*closers, func() { cli.Close() })
	c.cli, c.lockCli = cli, cli
	if cfg.fault == faultLost {
		return c.lossy(urls, closers)
	}
	return nil
}

// illegalKinds checks the registers of each kind on their own: which of
// them an illegal history's violations are on.
func illegalKinds(h *History, kinds []string) map[string]bool {
	out := map[string]bool{}
	ops := h.Operations()
	for _, kind := range kinds {
		var these []porcupine.Operation
		for _, op := range ops {
			if op.Input.(Input).Kind == kind {
				these = append(these, op)
			}
		}
		if porcupine.CheckOperationsTimeout(Model(), these, 10*time.Second) == porcupine.Illegal {
			out[kind] = true
		}
	}
	return out
}

// countManifest counts the manifest operations in h.
func countManifest(h *History) manifestCounts {
	var m manifestCounts
	for _, op := range h.Operations() {
		in := op.Input.(Input)
		switch {
		case in.Kind != KindManifest:
		case in.Write:
			m.writes++
			m.byOutcome[op.Output.(Output).Outcome]++
		default:
			m.reads++
		}
	}
	return m
}

// startOracle starts the run's lock oracle on a client of its own that,
// like the victim's watch, reaches the members the way the faults leave
// alone: not through the clients' proxies, and for a network run from the
// observer host, which no cut isolates.
func startOracle(t testing.TB, ctx context.Context, newClient func([]string) (*clientv3.Client, error), cfg runConfig) *Oracle {
	t.Helper()
	cli, err := newClient(cfg.endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	o, err := StartOracle(ctx, cli, cfg.prefix+"/lock/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Stop)
	return o
}

// newSQL opens a SQLite database with the register table, fenced by
// sqlfence.
func newSQL(t testing.TB) (*sql.DB, *sqlfence.Fence) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "regs.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f, err := sqlfence.New(sqlfence.SQLite, "regs", "id")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE regs (id TEXT PRIMARY KEY, val TEXT NOT NULL, ` + f.ColumnDDL() + `)`); err != nil {
		t.Fatal(err)
	}
	return db, f
}

// tally is a tier's summary.
type tally struct {
	mu                                     sync.Mutex
	runs, invalid, ops, histories          int
	staleAccepted, controlRuns, violations int
	keeperRuns                             int // valid runs whose clients used a Keeper
	faults                                 map[fault]int
	// The lock oracle, over every run, valid or not (a grant is checked
	// whatever the pause achieved): grants checked, invalid ones, runs
	// whose history could not cover every grant, and the forged early
	// grants (flagged of forged).
	grants, invalidGrants, inconclusive, forged, flagged int
	// The liveness oracle, over every run: waiters whose turn came that it
	// checked, the stuck ones, and runs it could not check in full.
	waitsChecked, stuckWaiters, livenessInconclusive int
	closest                                          float64 // the largest share of the bound a waiter in time used
	delayRuns                                        int     // valid runs whose sessions used a lock delay
	// The manifest registers' operations, in fenced and in control runs,
	// and the valid control runs whose violations the checker finds on the
	// registers of each kind alone.
	manifest, controlManifest manifestCounts
	kindViolations            map[string]int
	end                       endTally // the end-of-run checks, over every run
}

func (s *tally) add(cfg runConfig, r runResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults == nil {
		s.faults, s.kindViolations = map[fault]int{}, map[string]int{}
	}
	if cfg.fenced {
		s.manifest.add(r.manifest)
	} else {
		s.controlManifest.add(r.manifest)
	}
	s.runs++
	s.ops += r.ops
	s.histories++
	s.grants += r.oracle.Grants
	s.invalidGrants += len(r.oracle.Invalid)
	s.forged += r.oracle.Forged
	s.flagged += r.oracle.Flagged
	if r.oracle.Lost != nil {
		s.inconclusive++
	}
	s.waitsChecked += r.liveness.Checked
	s.stuckWaiters += len(r.liveness.Stuck)
	s.closest = max(s.closest, r.liveness.Closest)
	if r.liveness.Lost != nil {
		s.livenessInconclusive++
	}
	s.end.add(r.end, cfg.fault == faultLost)
	if !r.valid {
		s.invalid++
		return
	}
	s.faults[cfg.fault]++
	if cfg.keeper {
		s.keeperRuns++
	}
	if cfg.lockDelay > 0 {
		s.delayRuns++
	}
	if cfg.fenced {
		s.staleAccepted += r.staleAccepted
	} else {
		s.controlRuns++
		if r.check == porcupine.Illegal {
			s.violations++
		}
		for kind := range r.illegal {
			s.kindViolations[kind]++
		}
	}
}

func (s *tally) line(tier string) string {
	var fs []string
	for _, f := range allFaults {
		fs = append(fs, fmt.Sprintf("%s=%d", f, s.faults[f]))
	}
	var ks []string
	for _, k := range allKinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, s.kindViolations[k]))
	}
	return fmt.Sprintf("chaos %s tier: runs=%d faults{%s} keeper-runs=%d lock-delay-runs=%d ops=%d histories=%d stale-accepted=%d control-violations=%d/%d by-kind{%s} invalid=%d grants=%d invalid-grants=%d oracle-inconclusive=%d oracle-controls=%d/%d waits-checked=%d stuck-waiters=%d liveness-inconclusive=%d closest-to-bound=%.0f%% fenced-%s control-%s %s",
		tier, s.runs, strings.Join(fs, " "), s.keeperRuns, s.delayRuns, s.ops, s.histories, s.staleAccepted, s.violations, s.controlRuns, strings.Join(ks, " "), s.invalid,
		s.grants, s.invalidGrants, s.inconclusive, s.flagged, s.forged, s.waitsChecked, s.stuckWaiters, s.livenessInconclusive, 100*s.closest, s.manifest, s.controlManifest, &s.end)
}

// report fails the test for a fenced run whose history the checker did not
// accept, saving the history and its visualization.
func report(t testing.TB, cfg runConfig, r runResult) {
	t.Helper()
	if r.check == porcupine.Ok && r.staleAccepted == 0 {
		return
	}
	dir := os.Getenv("LEASEFENCE_CHAOS_DIR") // default: the system's temp dir
	folder, err := r.history.Save(dir, fmt.Sprintf("chaos-%s-%d", cfg.fault, cfg.seed), r.info)
	if err != nil {
		t.Errorf("saving the history: %v", err)
	}
	t.Errorf("run seed=%d fault=%s mutant=%v: checker says %s, %d stale writes accepted; history and visualization in %s",
		cfg.seed, cfg.fault, cfg.mutant, r.check, r.staleAccepted, folder)
}
