package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/holdback"
	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease"
)

// The lostanswers fault kind: as pause, and besides, a fraction of the
// writes (Txn, Put, DeleteRange) that each client's sessions send either
// are applied by etcd and their answer lost, or fail at once and are sent
// 50 to 500 ms later, after the caller gave up and maybe after its
// cleanup: lock puts, withdrawals, unlocks and lock-delay records alike
// (holdback.Losses). The cut is a gRPC interceptor in the sessions' own
// etcd client, the one place in the client's path that sees one request
// and its answer: etcd's fault proxy copies bytes and cannot drop one
// answer without breaking the connection and every call on it. Past the
// cut etcd has applied the request, as past a real connection lost
// before its answer. The fenced writes and reads go through the client's
// other etcd client, on the same proxies, unfaulted: their unknown
// outcomes are the other kinds' business.
//
// At most lossesInWindow faults fall in any lossWindow on one client, so
// that a waiter's retried write fails at most that many times in a row,
// which the liveness bound allows for (LostAnswersAllowance).
const (
	lossRate       = 0.3
	lossesInWindow = 2
	lossWindow     = time.Second
)

// lossy gives c's sessions an etcd client of their own on urls (the same
// proxies as c.cli), whose writes a Losses faults.
func (c *chaosClient) lossy(urls []string, closers *[]func()) error {
	c.losses = holdback.NewLosses(holdback.LossConfig{Seed: c.cfg.seed<<8 | uint64(c.id),
		Rate: lossRate, MaxInWindow: lossesInWindow, Window: lossWindow})
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.losses.Unary())}})
	if err != nil {
		c.losses.Abort()
		return err
	}
	*closers = append(*closers, func() { cli.Close() }, c.losses.Abort)
	c.lockCli = cli
	return nil
}

// stopLosses stops every client's faults and waits until each late write
// was sent (at most the longest delay and a send's limit), and sums what
// they did.
func stopLosses(clients []*chaosClient) holdback.LossCounts {
	var sum holdback.LossCounts
	for _, c := range clients {
		if c.losses == nil {
			continue
		}
		c.losses.Stop()
		n := c.losses.Counts()
		sum.Lost += n.Lost
		sum.Late += n.Late
		sum.LateFailed += n.LateFailed
	}
	return sum
}

// endLog collects the holdings whose key was deleted while its lease
// lived: no one in a run deletes another client's key, and a lock's own
// Unlock or cleanup ends it without ErrKeyDeleted; such a deletion came
// from a stray request of the key's own session (a withdrawal applied
// late, say).
type endLog struct {
	mu      sync.Mutex
	deleted []string
	keys    []string
	notes   map[string][]string // by key: Unlocks that failed, for the reports
}

// note records what happened to key that a report on it should tell.
func (e *endLog) note(key, what string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.notes == nil {
		e.notes = map[string][]string{}
	}
	e.notes[key] = append(e.notes[key], what)
}

// story is key's story in the oracle's history, and the notes on it.
func (e *endLog) story(oracle *Oracle, key string) string {
	e.mu.Lock()
	notes := slices.Clone(e.notes[key])
	e.mu.Unlock()
	s := oracle.Story(key)
	for _, n := range notes {
		s += "\n\t\tnote: " + n
	}
	return s
}

func (e *endLog) add(key, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deleted = append(e.deleted, why)
	e.keys = append(e.keys, key)
}

// list says why each holding is in the log, with its key's story.
func (e *endLog) list(oracle *Oracle) []string {
	e.mu.Lock()
	out, keys := slices.Clone(e.deleted), slices.Clone(e.keys)
	e.mu.Unlock()
	for i := range out {
		out[i] += e.story(oracle, keys[i])
	}
	return out
}

// keyDeleted logs key (token 0: a call that returned no lock) if err
// says its key was deleted while held or waiting, and s's lease still
// lives: the deletion was not the lease's end. A holding lost while its
// Unlock was in flight is not looked at (its own delete, whose answer
// was lost, may look like someone else's).
func (c *chaosClient) keyDeleted(s *lease.Session, key string, token int64, err error) {
	if c.tools == nil || c.ends == nil || !errors.Is(err, lease.ErrKeyDeleted) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ttl, lerr := c.tools.TimeToLive(ctx, s.Lease())
	if lerr != nil || ttl.GrantedTTL == 0 {
		return // the lease ended (etcd knows it no more), and its keys with it
	}
	c.ends.add(key, fmt.Sprintf("client %d: key %s (token %d) deleted while its lease %x lived (%d s left): %v",
		c.id, key, token, int64(s.Lease()), ttl.TTL, err))
}

// endResult is what the end-of-run checks found: once every client has
// let go of its locks and every late write landed, with each client's
// last session still open.
type endResult struct {
	sessions int      // live sessions whose names were tried
	orphans  []string // keys under a lock name on a live lease that no lock holds
	stranded []string // names a live session could not take with no holder
	deleted  []string // holdings whose key was deleted while its lease lived (endLog)
	// The control: a key planted at a live session's own path, outside
	// the library; both checks must report it.
	planted, orphanFlagged, strandedFlagged bool
	lost                                    error // the checks could not be made
	losses                                  holdback.LossCounts
}

// lockName is the run's i-th lock name.
func (r *runConfig) lockName(i int) string { return fmt.Sprintf("%s/lock/%d", r.prefix, i) }

// orphan is a key directly under a run lock name's prefix, on a live
// lease.
type orphan struct {
	name, key       string
	lease, lifeLeft int64
	created         int64
}

func (o orphan) String() string {
	return fmt.Sprintf("%s (lease %x, %d s left; created at %d)", o.key, o.lease, o.lifeLeft, o.created)
}

// liveKeys reads every key directly under each run lock name's prefix
// (not keys-only: etcd 3.7 leaves Lease out of those) and returns those
// whose lease lives: etcd still knows it (its granted TTL is not 0; the
// TTL left is in whole seconds, 0 for most of a 1-second lease's life).
func liveKeys(ctx context.Context, cli *clientv3.Client, cfg *runConfig) ([]orphan, error) {
	var out []orphan
	left := map[int64]int64{} // lease -> seconds left, -1 if gone
	for i := range cfg.names {
		name := cfg.lockName(i)
		resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix())
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			if kv.Lease == 0 || strings.Contains(strings.TrimPrefix(string(kv.Key), name+"/"), "/") {
				continue
			}
			ttl, ok := left[kv.Lease]
			if !ok {
				r, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
				if err != nil {
					return nil, err
				}
				ttl = r.TTL
				if r.GrantedTTL == 0 {
					ttl = -1 // gone
				}
				left[kv.Lease] = ttl
			}
			if ttl >= 0 {
				out = append(out, orphan{name: name, key: string(kv.Key), lease: kv.Lease, lifeLeft: ttl, created: kv.CreateRevision})
			}
		}
	}
	return out, nil
}

// awaitOrphans waits until no key under a run lock name lies on a live
// lease, for up to the sessions' TTL and a second (etcd's revoke batches
// take up to half of that): a key left on a session that ended goes with
// its lease by then, and one on a live session should not be there at
// all once the library had its chance to clean up. What is left then is
// an orphan.
func awaitOrphans(ctx context.Context, cli *clientv3.Client, cfg *runConfig) ([]orphan, error) {
	deadline := time.Now().Add(cfg.ttl + time.Second)
	for {
		keys, err := liveKeys(ctx, cli, cfg)
		if err != nil || len(keys) == 0 || time.Now().After(deadline) {
			return keys, err
		}
		rest(ctx, 100*time.Millisecond)
	}
}

// endChecks makes the end-of-run checks and their control. Every client
// has left its loop, let go of its holdings, and kept its last session.
// Each orphan and stranded name comes with the story of its key in the
// oracle's history.
func endChecks(clients []*chaosClient, tools *clientv3.Client, ends *endLog, oracle *Oracle) endResult {
	res := endResult{deleted: ends.list(oracle)}
	if len(clients) == 0 {
		return res
	}
	cfg := clients[0].cfg
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second+4*cfg.lockDelay)
	defer cancel()
	orphans, err := awaitOrphans(ctx, tools, cfg)
	if err != nil {
		res.lost = fmt.Errorf("orphan keys: %w", err)
		return res
	}
	blocked := map[string]bool{}
	for _, o := range orphans {
		res.orphans = append(res.orphans, o.String()+ends.story(oracle, o.key))
		blocked[o.name] = true
	}
	for _, c := range clients {
		s := c.session
		if s == nil || s.Err() != nil {
			continue
		}
		res.sessions++
		for i := range cfg.names {
			name := cfg.lockName(i)
			if why := c.tryName(ctx, s, name, blocked[name]); why != "" {
				res.stranded = append(res.stranded, why+ends.story(oracle, fmt.Sprintf("%s/%x", name, int64(s.Lease()))))
			}
		}
	}
	res.planted, res.orphanFlagged, res.strandedFlagged = plantControl(ctx, clients, tools)
	return res
}

// tryName takes name on s with TryLock and lets go, and says why not if
// it could not: a stranded name. A refusal with ErrKeyInUse is one at
// once; ErrLocked is one unless an orphan key lies under the name
// (reported as such); another error is one if it lasts three tries. A
// session that ends meanwhile has nothing to say.
func (c *chaosClient) tryName(ctx context.Context, s *lease.Session, name string, blocked bool) string {
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second+2*c.cfg.lockDelay+c.cfg.slack)
		var l *lease.Lock
		l, err = s.TryLock(tctx, name)
		cancel()
		switch {
		case err == nil:
			rctx, stop := context.WithTimeout(ctx, 5*time.Second+c.cfg.slack)
			c.release(rctx, l)
			stop()
			return ""
		case s.Err() != nil:
			return ""
		case errors.Is(err, lease.ErrKeyInUse):
			return fmt.Sprintf("client %d (lease %x): %s stranded: %v", c.id, int64(s.Lease()), name, err)
		case errors.Is(err, lease.ErrLocked) && blocked:
			return ""
		}
		rest(ctx, 100*time.Millisecond)
	}
	return fmt.Sprintf("client %d (lease %x): %s could not be taken with no holder: %v", c.id, int64(s.Lease()), name, err)
}

// plantControl puts a key at the own path of the first live session for
// the run's first lock name, on its lease, outside the library: an
// orphan (no lock holds it) and a stranded name (the session's TryLock
// finds its own path taken). It reports whether it planted one and
// whether each check flagged it, then removes it.
func plantControl(ctx context.Context, clients []*chaosClient, tools *clientv3.Client) (planted, orphanFound, stranded bool) {
	var c *chaosClient
	for _, cl := range clients {
		if cl.session != nil && cl.session.Err() == nil {
			c = cl
			break
		}
	}
	if c == nil {
		return false, false, false
	}
	s, name := c.session, c.cfg.lockName(0)
	key := fmt.Sprintf("%s/%x", name, int64(s.Lease()))
	resp, err := tools.Put(ctx, key, "planted", clientv3.WithLease(s.Lease()))
	if err != nil {
		return false, false, false
	}
	defer func() { // bounded; the session's Close takes it anyway
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		tools.Txn(dctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision)).
			Then(clientv3.OpDelete(key)).Commit()
	}()
	keys, err := liveKeys(ctx, tools, c.cfg)
	orphanFound = err == nil && slices.ContainsFunc(keys, func(o orphan) bool { return o.key == key })
	stranded = c.tryName(ctx, s, name, false) != ""
	return true, orphanFound, stranded
}

// reportEnd fails the test for each orphan key, stranded name and
// holding deleted under a live lease, and for a control the checks
// missed.
func reportEnd(t testing.TB, run string, e endResult) {
	t.Helper()
	if e.lost != nil {
		t.Logf("end-of-run checks inconclusive: %v", e.lost)
		return
	}
	for _, o := range e.orphans {
		t.Errorf("%s: orphan key %s", run, o)
	}
	for _, why := range e.stranded {
		t.Errorf("%s: stranded name: %s", run, why)
	}
	for _, why := range e.deleted {
		t.Errorf("%s: holding deleted under a live lease: %s", run, why)
	}
	if e.planted && (!e.orphanFlagged || !e.strandedFlagged) {
		t.Errorf("%s: the planted key was not reported (orphan %v, stranded %v): the end-of-run checks cannot fail",
			run, e.orphanFlagged, e.strandedFlagged)
	}
	t.Logf("end-of-run checks: %d live sessions tried every name; %d orphan keys, %d stranded names, %d holdings deleted under a live lease; control planted %v, flagged orphan %v stranded %v; writes faulted: %d answers lost, %d sent late (%d of them failed)",
		e.sessions, len(e.orphans), len(e.stranded), len(e.deleted), e.planted, e.orphanFlagged, e.strandedFlagged,
		e.losses.Lost, e.losses.Late+e.losses.LateFailed, e.losses.LateFailed)
}

// endTally is the tier's sum of the end-of-run checks.
type endTally struct {
	runs, inconclusive, sessions             int
	orphans, stranded, deleted               int
	planted, orphanFlagged, strandedFlagged  int
	answersLost, sentLate, lateFailed, lossy int
}

func (e *endTally) add(r endResult, lossy bool) {
	e.runs++
	if r.lost != nil {
		e.inconclusive++
		return
	}
	e.sessions += r.sessions
	e.orphans += len(r.orphans)
	e.stranded += len(r.stranded)
	e.deleted += len(r.deleted)
	if r.planted {
		e.planted++
	}
	if r.planted && r.orphanFlagged {
		e.orphanFlagged++
	}
	if r.planted && r.strandedFlagged {
		e.strandedFlagged++
	}
	if lossy {
		e.lossy++
	}
	e.answersLost += int(r.losses.Lost)
	e.sentLate += int(r.losses.Late + r.losses.LateFailed)
	e.lateFailed += int(r.losses.LateFailed)
}

func (e *endTally) String() string {
	return fmt.Sprintf("end-checked=%d orphan-keys=%d stranded-names=%d deleted-holdings=%d end-controls{orphan=%d/%d stranded=%d/%d} end-inconclusive=%d lost-writes{runs=%d answers-lost=%d sent-late=%d late-failed=%d}",
		e.runs-e.inconclusive, e.orphans, e.stranded, e.deleted, e.orphanFlagged, e.planted, e.strandedFlagged, e.planted,
		e.inconclusive, e.lossy, e.answersLost, e.sentLate, e.lateFailed)
}

// tierEnd holds the tier's end-of-run checks to account: no orphan key,
// no stranded name, no holding deleted under a live lease; every planted
// key reported by both checks, with some planted; few inconclusive runs;
// and in a tier with lostanswers runs, some answers lost and some writes
// sent late.
func tierEnd(t testing.TB, e *endTally) {
	t.Helper()
	if e.orphans != 0 || e.stranded != 0 || e.deleted != 0 {
		t.Errorf("end of runs: %d orphan keys, %d stranded names, %d holdings deleted under a live lease", e.orphans, e.stranded, e.deleted)
	}
	if e.planted == 0 || e.orphanFlagged != e.planted || e.strandedFlagged != e.planted {
		t.Errorf("end-of-run controls: %d planted, flagged %d as orphans and %d as stranded: the checks cannot fail", e.planted, e.orphanFlagged, e.strandedFlagged)
	}
	if e.inconclusive*4 > e.runs {
		t.Errorf("the end-of-run checks were inconclusive in %d of %d runs", e.inconclusive, e.runs)
	}
	if e.lossy > 0 && (e.answersLost == 0 || e.sentLate == 0) {
		t.Errorf("%d lostanswers runs lost %d answers and sent %d writes late: the fault is not happening", e.lossy, e.answersLost, e.sentLate)
	}
}

// lossyClient is a client of the shared member whose writes l faults.
func lossyClient(t *testing.T, l *holdback.Losses) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(l.Unary())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Every write faulted: each caller gets Unavailable, which is neither
// definite nor final; an answer lost leaves the write applied when the
// caller learns of it, a late one applies after, by Stop; reads pass.
func TestLostAnswers(t *testing.T) {
	ctx := etcdproc.Ctx(t, time.Minute)
	l := holdback.NewLosses(holdback.LossConfig{Seed: 1, Rate: 1, MaxInWindow: 1000, Window: time.Nanosecond,
		MinDelay: 200 * time.Millisecond, MaxDelay: 300 * time.Millisecond})
	cli, tools := lossyClient(t, l), etcd.Client(t)
	pfx := etcdproc.Name(t, "lost") + "/"
	present := 0
	for i := range 20 {
		key := fmt.Sprint(pfx, i)
		_, err := cli.Put(ctx, key, "v")
		if status.Code(err) != codes.Unavailable || rpcerr.Definite(err) || !rpcerr.Transient(ctx, err) {
			t.Fatalf("put %s: %v; want Unavailable, not definite, transient", key, err)
		}
		if g, err := tools.Get(ctx, key); err != nil {
			t.Fatal(err)
		} else if len(g.Kvs) == 1 {
			present++
		}
	}
	if _, err := cli.Get(ctx, pfx+"0"); err != nil {
		t.Fatalf("a read was faulted: %v", err)
	}
	l.Stop()
	n := l.Counts()
	g, err := tools.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if n.Lost != int64(present) || n.Lost+n.Late != 20 || n.Lost == 0 || n.Late == 0 || n.LateFailed != 0 || g.Count != 20 {
		t.Fatalf("counts %+v, %d applied as the caller learned of the fault, %d applied by Stop; want 20 in all, some of each kind", n, present, g.Count)
	}
}

// The cap: at most MaxInWindow faults in any Window, whatever the rate;
// Abort drops the late writes not sent yet.
func TestLostAnswersCapAndAbort(t *testing.T) {
	ctx := etcdproc.Ctx(t, time.Minute)
	l := holdback.NewLosses(holdback.LossConfig{Seed: 2, Rate: 1, MaxInWindow: 2, Window: time.Minute,
		MinDelay: time.Minute, MaxDelay: time.Minute})
	cli, tools := lossyClient(t, l), etcd.Client(t)
	pfx := etcdproc.Name(t, "lostcap") + "/"
	failed := 0
	for i := range 6 {
		if _, err := cli.Put(ctx, fmt.Sprint(pfx, i), "v"); err != nil {
			failed++
		}
	}
	start := time.Now()
	l.Abort()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Abort took %v", d)
	}
	g, err := tools.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	n := l.Counts()
	if failed != 2 || n.Late != 0 || g.Count != int64(6-2+n.Lost) {
		t.Fatalf("%d of 6 puts failed, %d keys applied, counts %+v; want 2 failed, late ones dropped", failed, g.Count, n)
	}
}
