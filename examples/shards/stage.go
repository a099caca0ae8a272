package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/exampleenv"
)

// Environment of a worker process.
const (
	childRole    = "shards-worker"
	envEndpoints = "SHARDS_ENDPOINTS"
	envPrefix    = "SHARDS_PREFIX"
	envID        = "SHARDS_ID"
	envShards    = "SHARDS_COUNT"
	envTTL       = "SHARDS_TTL"
	envPeriod    = "SHARDS_PERIOD"
)

// pollEvery is how often the story reads who owns the shards while it
// waits for them to settle: the resolution of its measurements.
const pollEvery = 50 * time.Millisecond

// stage is the running story: the worker processes, what they said, and
// the client that reads who owns what.
type stage struct {
	ctx      context.Context
	cli      *clientv3.Client
	cfg      config
	keys     layout
	tl       *exampleenv.Timeline
	board    *board
	children map[string]*exampleenv.Child
	running  map[string]bool // started, and neither stopped nor killed
	started  int             // workers started so far, which names the next
	follow   sync.WaitGroup  // the goroutines that read the workers' lines
}

func newStage(ctx context.Context, cli *clientv3.Client, cfg config, keys layout, tl *exampleenv.Timeline) *stage {
	return &stage{ctx: ctx, cli: cli, cfg: cfg, keys: keys, tl: tl, board: newBoard(),
		children: map[string]*exampleenv.Child{}, running: map[string]bool{}}
}

// startWorker starts the next worker process and returns its name.
func (st *stage) startWorker() (string, error) {
	st.started++
	id := fmt.Sprintf("w%d", st.started)
	c, err := exampleenv.StartChild(st.ctx, id, childRole,
		envEndpoints+"="+strings.Join(st.cli.Endpoints(), ","), envPrefix+"="+string(st.keys),
		envID+"="+id, envShards+"="+strconv.Itoa(st.cfg.shards),
		envTTL+"="+st.cfg.ttl.String(), envPeriod+"="+st.cfg.period.String())
	if err != nil {
		return "", fmt.Errorf("start %s: %w", id, err)
	}
	st.children[id], st.running[id] = c, true
	st.follow.Add(1)
	go func() {
		defer st.follow.Done()
		for line := range c.Lines() {
			st.board.note(id, line, st.tl)
		}
	}()
	st.tl.Printf(id, "started as process %d", c.Pid())
	return id, nil
}

// stop asks every running worker to quit (they close their sessions,
// releasing their shards), kills any that does not, and waits until every
// line they wrote is read. It returns what each worker it asked wrote to
// stderr, and how it exited. It may be called more than once.
func (st *stage) stop() (stderr map[string]string, exits map[string]error) {
	// All at once: one by one, each quitting worker's shards would pass
	// to those still running, only to be released again.
	var quit sync.WaitGroup
	for id, c := range st.children {
		if st.running[id] {
			quit.Go(func() { c.Quit(st.cfg.ttl + 5*time.Second) })
		}
	}
	quit.Wait()
	stderr, exits = map[string]string{}, map[string]error{}
	for id, c := range st.children {
		if st.running[id] {
			exits[id], stderr[id] = c.Wait(), c.Stderr()
		}
		c.Stop()
		st.running[id] = false
	}
	st.follow.Wait()
	return stderr, exits
}

// ownership is who owns the shards, as etcd has it at one revision.
type ownership struct {
	owned int            // shards owned by a running worker
	per   map[string]int // those per worker
}

func (o ownership) String() string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(o.per)) {
		parts = append(parts, fmt.Sprintf("%s %d", id, o.per[id]))
	}
	return strings.Join(parts, ", ")
}

// lockKey is the first key in a shard's lock queue: the holder's.
type lockKey struct {
	token int64
	lease clientv3.LeaseID
}

// own reads, in one request, every shard's lock keys and fence record. A
// shard is owned by a running worker if the first key in its lock queue
// is on that worker's current session and the record holds that key's
// token: the worker has claimed it and can write.
func (st *stage) own() (ownership, error) {
	k := st.keys
	resp, err := st.cli.Txn(st.ctx).Then(
		clientv3.OpGet(k.locks(), clientv3.WithPrefix()),
		clientv3.OpGet(k.fences(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return ownership{}, fmt.Errorf("read owners: %w", err)
	}
	holders := map[int]lockKey{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		s, rest, ok := shardUnder(k.locks(), string(kv.Key))
		if h, seen := holders[s]; ok && rest != "" && (!seen || kv.CreateRevision < h.token) {
			holders[s] = lockKey{kv.CreateRevision, clientv3.LeaseID(kv.Lease)}
		}
	}
	records := map[int]int64{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if s, _, ok := shardUnder(k.fences(), string(kv.Key)); ok {
			records[s], _ = fence.DecodeToken(string(kv.Value))
		}
	}
	whose := st.board.sessions(st.running)
	o := ownership{per: map[string]int{}}
	for id := range whose {
		o.per[whose[id]] = 0
	}
	for s, h := range holders {
		if id, ok := whose[h.lease]; ok && records[s] == h.token {
			o.owned++
			o.per[id]++
		}
	}
	return o, nil
}

// settled tells whether every shard is owned by a running worker, none
// of which holds more than its fair share, and every running worker has
// joined: the workers have rebalanced.
func (st *stage) settled(o ownership) bool {
	running := 0
	for _, r := range st.running {
		if r {
			running++
		}
	}
	if o.owned != st.cfg.shards || len(o.per) != running {
		return false
	}
	share := fairShare(st.cfg.shards, len(o.per))
	for _, n := range o.per {
		if n > share {
			return false
		}
	}
	return true
}

// awaitSettled reads who owns the shards every pollEvery until they have
// settled, and returns how long after from that was, or an error after
// within.
func (st *stage) awaitSettled(from time.Time, within time.Duration) (time.Duration, error) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	deadline := time.Now().Add(within)
	var last ownership
	for time.Now().Before(deadline) {
		o, err := st.own()
		if err != nil {
			return 0, err
		}
		if st.settled(o) {
			took := time.Since(from)
			st.tl.Printf("etcd", "all %d shards owned %v later: %v (share %d)",
				st.cfg.shards, took.Round(time.Millisecond), o, fairShare(st.cfg.shards, len(o.per)))
			return took, nil
		}
		last = o
		select {
		case <-tick.C:
		case <-st.ctx.Done():
			return 0, st.ctx.Err()
		}
	}
	return 0, fmt.Errorf("shards not settled within %v: %d of %d owned (%v)", within, last.owned, st.cfg.shards, last)
}

// board is what the workers said, line by line. Waiters wake at every
// line.
type board struct {
	mu      sync.Mutex
	changed chan struct{}               // closed and replaced at every line
	lease   map[string]clientv3.LeaseID // each worker's session, from its last JOINED
	round   map[string]roundSeen        // each worker's last ROUND
	refused map[string][]refusal        // each worker's refused writes
}

type roundSeen struct{ n, held int }

// refusal is a write the fence refused.
type refusal struct {
	shard          int
	token, highest int64
	msg            string
}

func newBoard() *board {
	return &board{changed: make(chan struct{}), lease: map[string]clientv3.LeaseID{},
		round: map[string]roundSeen{}, refused: map[string][]refusal{}}
}

// note takes one line of worker who, and tells tl of the notable ones.
func (b *board) note(who, line string, tl *exampleenv.Timeline) {
	kind, rest, _ := strings.Cut(line, " ")
	b.mu.Lock()
	defer b.mu.Unlock()
	switch kind {
	case "JOINED":
		var id int64
		var ttl string
		fmt.Sscanf(rest, "%x %s", &id, &ttl)
		b.lease[who] = clientv3.LeaseID(id)
		tl.Printf(who, "joined: session %x, TTL %s", id, ttl)
	case "ROUND":
		var r roundSeen
		fmt.Sscanf(rest, "%d %d", &r.n, &r.held)
		b.round[who] = r
	case "REFUSED":
		var r refusal
		fmt.Sscanf(rest, "%d %d %d", &r.shard, &r.token, &r.highest)
		if f := strings.SplitN(rest, " ", 4); len(f) == 4 {
			r.msg = f[3]
		}
		b.refused[who] = append(b.refused[who], r)
	case "PASS":
		tl.Printf(who, "pass: %s", rest)
	case "LOST":
		tl.Printf(who, "lost its session: %s", rest)
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// await waits until cond, called under the board's lock, holds, checking
// at every line; or until within has passed.
func (b *board) await(ctx context.Context, within time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		ok, changed := cond(), b.changed
		b.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("no %s within %v", what, within)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// read calls f under the board's lock.
func (b *board) read(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f()
}

// sessions maps the current session of each running worker to its name.
func (b *board) sessions(running map[string]bool) map[clientv3.LeaseID]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := map[clientv3.LeaseID]string{}
	for id, l := range b.lease {
		if running[id] {
			m[l] = id
		}
	}
	return m
}
