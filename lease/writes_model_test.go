package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// The write model: the session's own code decides and sends every write
// of its lock keys (lease.SetKeys routes them through a lossyKV), against
// a real etcd, while the model loses answers of applied requests, holds
// requests back and applies them at a later step, and makes the foreign
// writes a deployment sees: the marker deleted, another client's key put
// at the session's path on the session's own lease (a concurrency.Mutex
// sharing it) or on another lease, and other sessions' holdings that a
// late copy could hit. After every step no holding's key (the session's,
// another session's, the Mutex's) may have been deleted or changed; at
// the end, with every held request applied and every holding released,
// the session must be granted the name (none stranded) and must leave no
// key under it (no orphan). lease.WriteMutations are issue 46's defects
// with their fixes reverted; the model must catch each.

// writeWorld is one schedule's etcd, sessions and holdings.
type writeWorld struct {
	t     *testing.T
	rng   *rand.Rand
	cli   *clientv3.Client
	name  string
	s     *lease.Session // the session under test, its key writes lossy
	o     *lease.Session // another session, whose holdings a late copy could hit
	kv    *lossyKV
	lossy bool

	held *lease.Lock // the session's holding, if any
	// limbo: holdings whose Unlock had no answer: their key may be gone
	// already, or go when a held request applies; each must end.
	limbo []*lease.Lock
	other *lease.Lock // o's holding, if any
	mutex *concurrency.Mutex
	ms    *concurrency.Session // the Mutex's, on s's lease
	log   []string
}

// step names are what the failure prints.
func (w *writeWorld) note(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

func (w *writeWorld) ctx() context.Context { return etcdproc.Ctx(w.t, 10*time.Second) }

// fates: while the schedule runs, a third of the session's key writes
// lose their answer or are held back, and before one in eight the marker
// is deleted, inside the call that sends it.
func (w *writeWorld) decide(_ int, _ *heldTxn) fate {
	if !w.lossy {
		return pass
	}
	if w.rng.IntN(8) == 0 {
		if _, err := w.cli.Delete(w.ctx(), lease.MarkerKey(w.s, w.name)); err != nil {
			w.t.Error(err)
		}
		w.note("marker deleted inside a call")
	}
	switch r := w.rng.IntN(6); {
	case r == 0:
		return loseAnswer
	case r == 1:
		return hold
	}
	return pass
}

// check fails if a holding's key is not as its holder believes.
func (w *writeWorld) check(when string) error {
	for _, h := range []*lease.Lock{w.held, w.other} {
		if h == nil {
			continue
		}
		resp, err := w.cli.Get(w.ctx(), h.Key())
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != h.Token() {
			return fmt.Errorf("%s: holding %s@%d: its key is now %v", when, h.Key(), h.Token(), resp.Kvs)
		}
	}
	if w.mutex != nil {
		resp, err := w.cli.Get(w.ctx(), w.mutex.Key())
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != w.mutex.Header().Revision {
			return fmt.Errorf("%s: the shared-lease Mutex's key %s is now %v", when, w.mutex.Key(), resp.Kvs)
		}
	}
	return nil
}

// act makes one random step.
func (w *writeWorld) act() error {
	switch r := w.rng.IntN(10); {
	case r < 3:
		return w.lock()
	case r < 5:
		return w.unlock()
	case r == 5:
		w.note("replay: %d applied", w.kv.replay(w.t))
	case r == 6:
		_, err := w.cli.Delete(w.ctx(), lease.MarkerKey(w.s, w.name))
		w.note("marker deleted")
		return err
	case r == 7:
		return w.otherTurn()
	case r == 8:
		return w.mutexTurn()
	default:
		return w.foreignPut()
	}
	return nil
}

// lock takes the name through s with TryLock, Lock, RLock or Campaign,
// unless s holds it. A lost answer or a short ctx's end fails the call;
// any other failure is the model's.
func (w *writeWorld) lock() error {
	if w.held != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(w.ctx(), 300*time.Millisecond)
	defer cancel()
	var l *lease.Lock
	var err error
	switch kind := w.rng.IntN(4); kind {
	case 0:
		l, err = w.s.Lock(ctx, w.name)
	case 1:
		l, err = w.s.RLock(ctx, w.name)
	case 2:
		var e *lease.Leadership
		if e, err = w.s.Campaign(ctx, w.name, "v"); err == nil {
			l = e.Lock()
		}
	default:
		l, err = w.s.TryLock(ctx, w.name)
	}
	w.note("lock: %v", err)
	switch {
	case err == nil:
		w.held = l
	case errors.Is(err, errAnswerLost), errors.Is(err, lease.ErrLocked), errors.Is(err, context.DeadlineExceeded):
	case errors.Is(err, lease.ErrKeyInUse) && w.mutex != nil:
		// The Mutex on the session's lease holds the path: refused, as documented.
	default:
		return fmt.Errorf("lock: %w", err)
	}
	return nil
}

func (w *writeWorld) unlock() error {
	if w.held == nil {
		return nil
	}
	// Still held, perhaps, after no answer: the caller tries again, as
	// the doc says.
	for range 3 {
		err := w.held.Unlock(w.ctx())
		w.note("Unlock: %v", err)
		switch {
		case err == nil, errors.Is(err, lease.ErrKeyDeleted) && w.held.Err() != nil:
			// Released, or its key went with an earlier try's late apply.
			w.held = nil
			return nil
		case !errors.Is(err, errAnswerLost):
			return fmt.Errorf("Unlock: %w", err)
		}
	}
	w.limbo, w.held = append(w.limbo, w.held), nil
	return nil
}

// otherTurn takes the name through o if it is free, or lets o's holding go.
func (w *writeWorld) otherTurn() error {
	if w.other != nil {
		err := w.other.Unlock(w.ctx())
		w.note("other Unlock: %v", err)
		w.other = nil
		return err
	}
	l, err := w.o.TryLock(w.ctx(), w.name)
	w.note("other TryLock: %v", err)
	if err == nil {
		w.other = l
	} else if !errors.Is(err, lease.ErrLocked) {
		return fmt.Errorf("other TryLock: %w", err)
	}
	return nil
}

// mutexTurn takes the name with a concurrency.Mutex on s's own lease, if
// the session's path is free, or lets it go.
func (w *writeWorld) mutexTurn() error {
	if w.mutex != nil {
		err := w.mutex.Unlock(w.ctx())
		w.note("Mutex Unlock: %v", err)
		w.mutex = nil
		return err
	}
	if w.held != nil {
		return nil
	}
	// Two clients on one lease share a path: a Mutex takes a key found
	// there for its own, as two Mutexes of one session do. Only a free
	// path makes the Mutex's key its own.
	if resp, err := w.cli.Get(w.ctx(), keyOf(w.name, w.s)); err != nil || len(resp.Kvs) != 0 {
		return err
	}
	m := concurrency.NewMutex(w.ms, w.name)
	err := m.TryLock(w.ctx())
	w.note("Mutex TryLock: %v", err)
	switch {
	case err == nil:
		w.mutex = m
	case errors.Is(err, concurrency.ErrLocked):
		// Another key is older; the Mutex's own is gone again.
	default:
		return fmt.Errorf("Mutex TryLock: %w", err)
	}
	return nil
}

// foreignPut puts a key at the session's path on o's lease while the
// session holds nothing: no lock, which the session removes.
func (w *writeWorld) foreignPut() error {
	if w.held != nil || w.mutex != nil {
		return nil
	}
	_, err := w.cli.Put(w.ctx(), keyOf(w.name, w.s), "", clientv3.WithLease(w.o.Lease()))
	w.note("foreign put at the session's path on another lease")
	return err
}

// finish applies what is held, releases every holding, and checks that
// the session is granted the name and leaves nothing under it.
func (w *writeWorld) finish() error {
	w.lossy = false
	w.note("replay: %d applied", w.kv.replay(w.t))
	if err := w.check("after the last replay"); err != nil {
		return err
	}
	for _, l := range w.limbo {
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			return fmt.Errorf("a holding whose Unlock had no answer never ended, with every request applied: %v", l.Key())
		}
	}
	for _, release := range []func() error{w.unlock, func() error {
		if w.other == nil {
			return nil
		}
		return w.otherTurn()
	}, func() error {
		if w.mutex == nil {
			return nil
		}
		return w.mutexTurn()
	}} {
		if err := release(); err != nil {
			return err
		}
	}
	l, err := w.s.TryLock(w.ctx(), w.name)
	if err != nil {
		return fmt.Errorf("stranded: the session's TryLock of the free name: %w", err)
	}
	if err := l.Unlock(w.ctx()); err != nil {
		return err
	}
	resp, err := w.cli.Get(w.ctx(), w.name+"/", clientv3.WithPrefix())
	if err != nil {
		return err
	}
	if len(resp.Kvs) != 0 {
		return fmt.Errorf("orphan: %d keys left under the free name, the first %s on lease %x", len(resp.Kvs), resp.Kvs[0].Key, resp.Kvs[0].Lease)
	}
	return nil
}

// writeTally counts what the model's schedules did.
type writeTally struct {
	requests, lost, held, lateApplied, steps int
}

// runWrites runs one schedule of steps; mutate, if set, plants a bug in
// the session's writes; tally, if set, adds up what it did.
func runWrites(t *testing.T, cli *clientv3.Client, seed uint64, steps int, mutate func(*lease.Session), tally ...*writeTally) error {
	w := &writeWorld{t: t, rng: rand.New(rand.NewPCG(seed, 46)), cli: cli, lossy: true,
		name: etcdproc.Name(t, fmt.Sprintf("writes-%d", seed))}
	// Half the schedules renew through a Keeper: the queue's copy path.
	var opts []lease.Option
	if seed%2 == 1 {
		k, err := lease.NewKeeper(cli)
		if err != nil {
			return err
		}
		defer k.Close()
		opts = append(opts, lease.WithKeeper(k))
	}
	var err error
	if w.s, err = lease.NewSession(w.ctx(), cli, opts...); err != nil {
		return err
	}
	defer w.s.Close()
	if w.o, err = lease.NewSession(w.ctx(), cli); err != nil {
		return err
	}
	defer w.o.Close()
	if w.ms, err = concurrency.NewSession(cli, concurrency.WithLease(w.s.Lease())); err != nil {
		return err
	}
	defer w.ms.Orphan()
	if mutate != nil {
		mutate(w.s)
	}
	w.kv = &lossyKV{KV: cli, decide: w.decide}
	lease.SetKeys(w.s, w.kv)
	defer func() {
		w.kv.mu.Lock()
		defer w.kv.mu.Unlock()
		for _, c := range tally {
			c.requests, c.lost, c.held = c.requests+w.kv.n, c.lost+w.kv.lost, c.held+w.kv.heldBack
			c.lateApplied, c.steps = c.lateApplied+w.kv.lateApplied, c.steps+steps
		}
	}()
	for i := range steps {
		if err := w.act(); err != nil {
			return w.failed(seed, err)
		}
		if err := w.check(fmt.Sprintf("step %d", i)); err != nil {
			return w.failed(seed, err)
		}
	}
	if err := w.finish(); err != nil {
		return w.failed(seed, err)
	}
	return nil
}

func (w *writeWorld) failed(seed uint64, err error) error {
	return fmt.Errorf("seed %d: %w\nsteps: %q", seed, err, w.log)
}

// writeSchedules is how many schedules the ordinary test run explores.
const writeSchedules = 150

func TestWriteModel(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	var tally writeTally
	for seed := range uint64(writeSchedules) {
		if err := runWrites(t, cli, seed, 14, nil, &tally); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d schedules, %d steps: %d key writes, %d answers lost, %d held back, %d of those applied late",
		writeSchedules, tally.steps, tally.requests, tally.lost, tally.held, tally.lateApplied)
}
