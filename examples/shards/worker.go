package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

// The worker's tuning, together.
const (
	// parallel is how many requests a worker has in flight in a pass or a
	// round: enough to hide etcd's round trip behind one another, few
	// enough not to crowd out the other workers on a small etcd.
	parallel = 8
	// workTime is the work of a round before its writes (reading each
	// shard's input, say). The demo stops a worker in it, so that its
	// writes go out after the pause, with the tokens it had before.
	workTime = 100 * time.Millisecond
)

// workerConfig is one worker's part of a run.
type workerConfig struct {
	id     string
	keys   layout
	shards int
	ttl    time.Duration // of the worker's session
	period time.Duration // between passes, at most
}

// worker owns shards. Its loop (serve) runs on one goroutine, which alone
// touches held and live; the requests of a pass or a round run on
// goroutines it starts and waits for, each on a holding of its own.
type worker struct {
	cfg  workerConfig
	cli  *clientv3.Client
	pref []int // the shards in this worker's order of preference
	// recs has one Recorder per shard, kept for the life of the process
	// as package fence asks: across holdings and sessions.
	recs []*fence.Recorder
	held map[int]*holding
	live int // workers the last pass counted, for its report

	rounds int
	mu     sync.Mutex // serializes lines on out
	out    io.Writer  // one line per event, for whoever follows the worker
	log    *log.Logger
}

// holding is one shard held by one lock.
type holding struct {
	lock *lease.Lock
	// count is the shard's count as this holding last read or wrote it;
	// synced says it is known: not before the claim's read, nor after a
	// write whose outcome is unknown, until a claim reads it again.
	count  int64
	synced bool
	// stale: the fence refused the holding, so a later holder has claimed
	// the shard, whatever the lock says.
	stale bool
}

func newWorker(cli *clientv3.Client, cfg workerConfig, out, errOut io.Writer) *worker {
	w := &worker{cfg: cfg, cli: cli, pref: preference(cfg.id, cfg.shards),
		recs: make([]*fence.Recorder, cfg.shards), held: map[int]*holding{},
		out: out, log: log.New(errOut, cfg.id+": ", log.Lmicroseconds)}
	for s := range w.recs {
		w.recs[s] = fence.NewRecorder(cfg.keys.fenceKey(s))
	}
	return w
}

// say writes one event line: JOINED, PASS, ROUND, REFUSED or LOST.
func (w *worker) say(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(w.out, format+"\n", args...)
}

// runWorker runs a worker until ctx ends. It opens a session and serves
// on it; when the session is lost (its lease expired while the process
// was paused, say), every holding has ended with it, and the worker
// starts over on a new session, as a new member.
func runWorker(ctx context.Context, cli *clientv3.Client, cfg workerConfig, out, errOut io.Writer) error {
	w := newWorker(cli, cfg, out, errOut)
	for ctx.Err() == nil {
		sess, err := lease.NewSession(ctx, cli, lease.WithTTL(cfg.ttl), lease.WithOwner(cfg.id))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("session: %w", err)
		}
		err = w.serve(ctx, sess)
		if lost := sess.Err(); lost != nil && ctx.Err() == nil {
			w.say("LOST %v", lost)
		}
		// Close releases what is still held, so that a worker that quits
		// hands its shards over at once, not at its lease's expiry.
		sess.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// serve is the worker's loop on one session: register, then a pass and a
// round every period, and at once when a worker joins or leaves. It
// returns nil when ctx or the session ends, an error if it cannot
// register.
func (w *worker) serve(ctx context.Context, sess *lease.Session) error {
	defer clear(w.held) // the holdings end with the session
	ctx, stop := sessionContext(ctx, sess)
	defer stop()
	rev, err := w.register(ctx, sess)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the session ended first: start over
		}
		return err
	}
	w.say("JOINED %x %v", int64(sess.Lease()), sess.TTL())
	changes := w.cli.Watch(ctx, w.cfg.keys.members(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(w.cfg.period)
	defer tick.Stop()
	for ctx.Err() == nil {
		w.pass(ctx, sess)
		w.round(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		case wr, ok := <-changes:
			if !ok || wr.Err() != nil {
				// Compacted or broken: watch again from now. Each pass
				// reads the members afresh, so only a wake-up is lost.
				changes = w.cli.Watch(ctx, w.cfg.keys.members(), clientv3.WithPrefix())
			}
		}
	}
	return nil
}

// sessionContext is ctx, ended also when the session ends, so that a pass
// waiting on an etcd that stopped answering gives up with the session.
// stop ends it and waits for its goroutine.
func sessionContext(ctx context.Context, sess *lease.Session) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-sess.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); <-done }
}

// register puts the worker's member key on the session's lease, so that
// it goes when the session does: at the lease's expiry for a worker that
// died or paused, at once for one that quit. The key is no lock key (it
// ends in the worker's ID, not the lease's hex), so the session's locks
// never mistake it for one of theirs. It returns the revision of the put,
// after which the worker watches the members.
func (w *worker) register(ctx context.Context, sess *lease.Session) (int64, error) {
	resp, err := w.cli.Put(ctx, w.cfg.keys.member(w.cfg.id), w.cfg.id, clientv3.WithLease(sess.Lease()))
	if err != nil {
		return 0, fmt.Errorf("register: %w", err)
	}
	return resp.Header.Revision, nil
}

// pass reads the members and the locked shards, decides, and carries the
// decision out: it releases surplus shards or takes free ones.
func (w *worker) pass(ctx context.Context, sess *lease.Session) {
	w.prune(ctx)
	v, err := w.look(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Print(err) // the next pass reads again
		}
		return
	}
	p := decide(v, w.heldSet(), w.pref)
	start := time.Now()
	released := w.release(ctx, p.release)
	took := w.take(ctx, sess, p.take, p.want)
	if released+took > 0 || v.live != w.live {
		w.live = v.live
		w.say("PASS live=%d share=%d held=%d took=%d released=%d in %v", v.live, p.share, len(w.held), took, released,
			time.Since(start).Round(time.Millisecond))
	}
}

// prune forgets the holdings that have ended: the lock says it is gone,
// or the fence refused a write, which means a later holder has claimed
// the shard whatever the lock says.
func (w *worker) prune(ctx context.Context) {
	for s, h := range w.held {
		if h.lock.Err() == nil && !h.stale {
			continue
		}
		if h.lock.Err() == nil {
			// Refused while the lock looks held: Unlock deletes only this
			// holding's own key, if it is still there. On an error the
			// key goes with the lease.
			_ = h.lock.Unlock(ctx)
		}
		delete(w.held, s)
	}
}

// heldSet is the shards held, for decide.
func (w *worker) heldSet() map[int]bool {
	set := make(map[int]bool, len(w.held))
	for s := range w.held {
		set[s] = true
	}
	return set
}

// look reads, in one request and so at one revision, the members and the
// shards that have a lock key.
func (w *worker) look(ctx context.Context) (view, error) {
	k := w.cfg.keys
	resp, err := w.cli.Txn(ctx).Then(
		clientv3.OpGet(k.members(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(k.locks(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return view{}, fmt.Errorf("look: %w", err)
	}
	v := view{live: 1, locked: make([]bool, w.cfg.shards)} // this worker, registered or not
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if k.memberID(string(kv.Key)) != w.cfg.id {
			v.live++
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if s, rest, ok := shardUnder(k.locks(), string(kv.Key)); ok && rest != "" && s < w.cfg.shards {
			v.locked[s] = true
		}
	}
	return v, nil
}

// release unlocks the given shards and forgets each it let go. One whose
// Unlock etcd did not answer is still held, and still written, until a
// later pass lets it go: its writes and its release are in this one loop,
// so no write of a shard is made after its release.
func (w *worker) release(ctx context.Context, shards []int) int {
	hs := make([]*holding, len(shards))
	for i, s := range shards {
		hs[i] = w.held[s]
	}
	errs := make([]error, len(hs))
	each(len(hs), func(i int) { errs[i] = hs[i].lock.Unlock(ctx) })
	n := 0
	for i, s := range shards {
		if errs[i] == nil || hs[i].lock.Err() != nil {
			delete(w.held, s)
			n++
		}
	}
	return n
}

// take tries the candidates, best first, a batch at a time, until it has
// taken want shards or none is left to try. No batch is larger than what
// is still wanted, so that the worker never goes over its share.
func (w *worker) take(ctx context.Context, sess *lease.Session, cands []int, want int) int {
	took := 0
	for len(cands) > 0 && took < want && ctx.Err() == nil {
		batch := cands[:min(parallel, want-took, len(cands))]
		cands = cands[len(batch):]
		got := make([]*holding, len(batch))
		each(len(batch), func(i int) { got[i] = w.takeOne(ctx, sess, batch[i]) })
		for i, h := range got {
			if h != nil {
				w.held[batch[i]] = h
				took++
			}
		}
	}
	return took
}

// takeOne takes one shard: TryLock, then the claim, whose read gives the
// shard's count. A shard that someone holds is no error: another worker
// took it since the pass looked.
func (w *worker) takeOne(ctx context.Context, sess *lease.Session, s int) *holding {
	l, err := sess.TryLock(ctx, w.cfg.keys.lockName(s))
	if err != nil {
		if !errors.Is(err, lease.ErrLocked) && ctx.Err() == nil {
			w.log.Printf("shard %d: %v", s, err)
		}
		return nil
	}
	h := &holding{lock: l}
	w.claim(ctx, s, h) // if it fails, the round claims again before writing
	return h
}

// claim raises the shard's fence record to the holding's token and reads
// the shard's data in the same transaction (fence.Claim): from then on no
// earlier holder's write can land, so the count read is the one to go on
// from. A plain read would not do: the previous holder's last write may
// still be on its way, and the record lets it through until this
// holding's first write raises it.
func (w *worker) claim(ctx context.Context, s int, h *holding) {
	wctx, cancel := h.lock.WriteContext(ctx)
	defer cancel()
	resp, err := fence.NewTxn(wctx, w.cli, fence.Claim(w.cfg.keys.fenceKey(s), h.lock.Token())).
		Then(clientv3.OpGet(w.cfg.keys.dataKey(s))).
		Commit()
	if err != nil {
		w.failed(s, h, err)
		return
	}
	h.count = 0
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		d, err := parseDatum(kvs[0].Value)
		if err != nil {
			w.log.Printf("shard %d: %v", s, err) // not ours: never written over
			return
		}
		h.count = d.count
	}
	h.synced = true
}

// round is the worker's work on its shards: the work itself, then one
// fenced write to each shard held.
func (w *worker) round(ctx context.Context) {
	type job struct {
		shard int
		h     *holding
	}
	jobs := make([]job, 0, len(w.held))
	for s, h := range w.held {
		jobs = append(jobs, job{s, h})
	}
	w.rounds++
	w.say("ROUND %d %d", w.rounds, len(jobs))
	time.Sleep(workTime) // the work, which does not look at ctx
	each(len(jobs), func(i int) { w.write(ctx, jobs[i].shard, jobs[i].h) })
}

// write makes one fenced write to the shard: the next count, under the
// holding's token, through the shard's Recorder (after its first write a
// holding's guard no longer rewrites the record, but etcd still checks
// it). It does not look at the lock's Err first: that is an early warning
// only, and says nothing in a process that was paused until it has run
// again; the fence refuses a stale write, with both tokens. WriteContext:
// a write begun as the holder still reaches etcd if the lock is lost
// meanwhile, and gets the fence's verdict.
func (w *worker) write(ctx context.Context, s int, h *holding) {
	if !h.synced {
		if w.claim(ctx, s, h); !h.synced {
			return
		}
	}
	next := datum{writer: w.cfg.id, token: h.lock.Token(), count: h.count + 1}
	wctx, cancel := h.lock.WriteContext(ctx)
	defer cancel()
	_, err := fence.NewTxn(wctx, w.cli, w.recs[s].Guard(next.token)).
		Then(clientv3.OpPut(w.cfg.keys.dataKey(s), next.String())).
		Commit()
	if err != nil {
		w.failed(s, h, err)
		return
	}
	h.count = next.count
}

// failed takes a claim's or a write's error. Refused: a later holder has
// claimed the shard, and this holding is done. Anything else, no answer
// above all: the write may have landed, so the count is unknown until a
// claim reads it back; fence never sends such a write again by itself.
func (w *worker) failed(s int, h *holding, err error) {
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		h.stale = true
		w.say("REFUSED %d %d %d %v", s, stale.Token, stale.Highest, err)
		return
	}
	h.synced = false
	if !errors.Is(err, context.Canceled) {
		w.log.Printf("shard %d: %v", s, err)
	}
}

// each runs f(0) to f(n-1), at most parallel at a time, and returns when
// all have returned.
func each(n int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}
