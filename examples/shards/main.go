// Command shards runs a shard owner: N worker processes share M shards,
// each shard a lock of its own, and each shard's writes fenced by its own
// token. The command starts four workers on 1,024 shards, then stops one
// with SIGSTOP past its lease and resumes it, kills another with SIGKILL,
// and adds a fifth, and measures each time how long the shards take to be
// owned again. Last it reads etcd's history of every shard and checks
// that no shard ever took a write from an old owner.
//
// Copy worker.go, plan.go and layout.go; the rest is the demo.
//
// # Membership
//
// A worker holds one lease.Session. It registers by putting
// PREFIX/members/ID on the session's lease, so the key goes when the
// session does: at the lease's expiry for a worker that died or paused,
// at once for one that quit (Session.Close revokes the lease). Every
// worker watches PREFIX/members/ to hear of joins and losses at once. A
// worker whose session is lost starts over with a new session, and joins
// again as a new member.
//
// # Fair share and rebalancing
//
// Each pass reads, in one request, the members and the shards' lock keys
// (plan.go's decide then needs no etcd). A worker's fair share is
// ceil(M / live workers): the shares add up to at least M, so every shard
// can be owned. A worker below its share takes free shards with TryLock
// (never waiting in a queue) until it has its share; one above it, after
// a join, releases its surplus with Unlock. Each worker prefers shards by
// rendezvous hashing of its ID and the shard, taking its best first and
// releasing its worst first, so that workers rarely reach for the same
// free shard. A pass runs every period, and at once when the members
// change.
//
// # Writes
//
// Each shard has a fence record, PREFIX/fence/SHARD, and a data key,
// PREFIX/data/SHARD, whose value names the writer, its token and a count.
// A worker that takes a shard first claims it (fence.Claim): the record is
// raised to its token in the same transaction that reads the count, so no
// earlier owner's write can land after that read. Every write goes through
// the shard's fence.Recorder with the shard's token, so a worker that was
// paused and resumes has its writes refused (*fence.StaleError) once
// another worker has claimed the shard. A worker writes and releases its
// shards in one loop, so it never writes a shard after releasing it.
//
// # How long a shard is without an owner
//
// A worker that is lost (killed, or paused past its lease) leaves its
// shards locked until etcd expires its lease: at most the TTL after its
// last keep-alive, and etcd sweeps expired leases every 500 ms. The other
// workers hear of it through their watch, finish the round they are in
// (at most about a period), and take the shards in their next pass. A
// worker that joins is counted at once; the others release their surplus
// after their round, and the joiner takes it at its next pass, at most a
// period after its last. So every shard is owned again within
//
//	lossBound = TTL + 2 × period + 1 s   after a worker is lost
//	joinBound = 2 × period + 1 s         after a worker joins (from its registration)
//
// where the second covers etcd's sweep and the requests of the pass that
// takes the shards: with 8 in flight, a share of 64 shards is 8 round
// trips of a TryLock and a claim, under 0.2 s on an idle machine. The
// demo measures each change against these, and its test checks them.
//
// # How many shards a worker can hold
//
// All of a worker's locks hang on its session's one lease, so holding
// them sends nothing but that lease's keep-alives; each held lock keeps a
// watch of its own key open, so that the worker hears of its loss. Taking
// a shard costs a TryLock and a claim; after that, what each shard costs
// is its share of the worker's writes, one fenced transaction per round
// (a Recorder keeps it to a compare and a put). A worker's limit is then
// the memory and goroutines of its held locks, and the write rate etcd
// sustains for all shards together over the round's period.
//
// Measured (bench/README.md, BenchmarkManyLocks, etcd in a process of its
// own on loopback, fsync off): a held lock costs the worker no goroutine
// and about 0.8 KB (0.77 to 0.99 KB at 10,000 and 100,000 held), and etcd
// about 0.6 KB for its watcher; 10,000 are taken at once in about 1 s,
// 100,000 in about 14 s. So 1,024 shards cost a worker under 1 MB, and a
// worker can hold 100,000 with about 80 MB. With etcd's auth on, each
// lock put makes etcd check every key already on the lease, so past a
// few thousand locks a session's grants slow down in proportion to what
// it holds: take that many shards through a lease.Pool, which spreads
// them over sessions of one Keeper (10,000 in 43 s through a Pool of
// 1,000 a session, against 246 s on one session).
//
// The exit status is 0 only if the resumed worker's writes were refused
// and the history check found no write from an old owner.
//
// With neither -endpoints nor ETCD_ENDPOINTS it starts an embedded etcd.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/internal/exampleenv"
)

func main() {
	if os.Getenv(exampleenv.ChildEnv) == childRole {
		if err := workerMain(os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, os.Getenv(envID)+":", err)
			os.Exit(1)
		}
		return
	}
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	cfg := config{}
	flag.IntVar(&cfg.workers, "workers", 4, "workers at the start")
	flag.IntVar(&cfg.shards, "shards", 1024, "shards")
	flag.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "lease TTL of the workers")
	flag.DurationVar(&cfg.period, "period", time.Second, "longest time between a worker's passes")
	flag.Parse()
	if _, err := run(*endpoints, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shards:", err)
		os.Exit(1)
	}
}

// config is the demo's.
type config struct {
	workers int // at the start
	shards  int
	ttl     time.Duration
	period  time.Duration
}

// lossBound is how soon every shard is owned again after a worker is
// lost (see the package doc).
func lossBound(ttl, period time.Duration) time.Duration { return ttl + joinBound(period) }

// joinBound is how soon the shards are settled again after a worker
// joins (see the package doc).
func joinBound(period time.Duration) time.Duration { return 2*period + time.Second }

// report is what a run measured: how long the shards took to settle
// after each change, and what the history check found.
type report struct {
	start, pause, resume, kill, add time.Duration
	refused                         []refusal // the resumed worker's
	audit                           audit
	// Where the run's history is: its keys, from revision from on.
	keys layout
	from int64
	// What each worker that was asked to quit wrote to stderr, and how it
	// exited.
	stderr map[string]string
	exits  map[string]error
}

func run(endpoints string, cfg config, out io.Writer) (report, error) {
	var rep report
	if cfg.workers < 2 || cfg.shards < cfg.workers+1 {
		return rep, errors.New("want two workers or more, and more shards than workers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, closeAll, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return rep, err
	}
	defer closeAll()
	keys := layout(fmt.Sprintf("shards-%x", time.Now().UnixNano()&0xffffff))
	start, err := cli.Get(ctx, keys.done())
	if err != nil {
		return rep, fmt.Errorf("read revision: %w", err)
	}
	fmt.Fprintf(out, "%d workers, %d shards, TTL %v, a pass at least every %v: owned again within %v of a loss, settled within %v of a join\n\n",
		cfg.workers, cfg.shards, cfg.ttl, cfg.period, lossBound(cfg.ttl, cfg.period), joinBound(cfg.period))
	rep.keys, rep.from = keys, start.Header.Revision+1
	st := newStage(ctx, cli, cfg, keys, exampleenv.NewTimeline(out))
	defer st.stop()
	if err := st.play(&rep); err != nil {
		return rep, err
	}
	rep.stderr, rep.exits = st.stop()
	h, err := readHistory(ctx, cli, keys, rep.from)
	if err != nil {
		return rep, err
	}
	rep.audit = check(keys, cfg.shards, h)
	return rep, verdict(rep, cfg, out)
}

// play is the story: start, pause and resume, kill, add.
func (st *stage) play(rep *report) error {
	steps := []func(*report) error{st.begin, st.pauseAndResume, st.kill, st.add}
	for _, step := range steps {
		if err := step(rep); err != nil {
			return err
		}
	}
	return nil
}

// begin starts the workers and waits until they share the shards.
func (st *stage) begin(rep *report) error {
	from := time.Now()
	for range st.cfg.workers {
		if _, err := st.startWorker(); err != nil {
			return err
		}
	}
	var err error
	rep.start, err = st.awaitSettled(from, 2*joinBound(st.cfg.period)+10*time.Second)
	return err
}

// pauseAndResume stops w1 with SIGSTOP in the middle of a round, until
// the others own all shards, then resumes it: its round's writes go out
// with its old tokens and must be refused; it finds its session lost and
// joins again.
func (st *stage) pauseAndResume(rep *report) error {
	const victim = "w1"
	var before, round roundSeen
	st.board.read(func() { before = st.board.round[victim] })
	if err := st.board.await(st.ctx, 10*st.cfg.period, victim+" round", func() bool {
		round = st.board.round[victim]
		return round.n > before.n && round.held > 0
	}); err != nil {
		return err
	}
	c := st.children[victim]
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop %s: %w", victim, err)
	}
	from := time.Now()
	st.running[victim] = false
	st.tl.Printf(victim, "SIGSTOP in round %d, before its writes to %d shards (think GC pause, a stalled VM)", round.n, round.held)
	var err error
	if rep.pause, err = st.awaitSettled(from, lossBound(st.cfg.ttl, st.cfg.period)+10*time.Second); err != nil {
		return err
	}
	oldSession := st.board.sessions(map[string]bool{victim: true})
	if err := c.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume %s: %w", victim, err)
	}
	st.tl.Printf(victim, "SIGCONT after %v (TTL %v): finishes round %d with the tokens it had",
		time.Since(from).Round(time.Millisecond), st.cfg.ttl, round.n)
	st.running[victim] = true
	if err := st.board.await(st.ctx, st.cfg.ttl+10*time.Second, victim+" joining again", func() bool {
		_, same := oldSession[st.board.lease[victim]]
		return !same
	}); err != nil {
		return err
	}
	joined := time.Now()
	st.board.read(func() { rep.refused = slices.Clone(st.board.refused[victim]) })
	st.tellRefused(victim, rep.refused)
	rep.resume, err = st.awaitSettled(joined, joinBound(st.cfg.period)+10*time.Second)
	return err
}

// tellRefused prints how many of who's writes were refused, and one of
// the refusals.
func (st *stage) tellRefused(who string, rs []refusal) {
	if len(rs) == 0 {
		st.tl.Printf(who, "no write refused")
		return
	}
	st.tl.Printf(who, "%d writes REFUSED; shard %d: %s", len(rs), rs[0].shard, rs[0].msg)
}

// kill kills w2 outright.
func (st *stage) kill(rep *report) error {
	const victim = "w2"
	if err := st.children[victim].Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", victim, err)
	}
	from := time.Now()
	st.running[victim] = false
	st.tl.Printf(victim, "SIGKILL")
	var err error
	rep.kill, err = st.awaitSettled(from, lossBound(st.cfg.ttl, st.cfg.period)+10*time.Second)
	return err
}

// add starts one more worker and waits until it has its share.
func (st *stage) add(rep *report) error {
	id, err := st.startWorker()
	if err != nil {
		return err
	}
	if err := st.board.await(st.ctx, 10*time.Second, id+" joining", func() bool { return st.board.lease[id] != 0 }); err != nil {
		return err
	}
	rep.add, err = st.awaitSettled(time.Now(), joinBound(st.cfg.period)+10*time.Second)
	return err
}

// verdict prints the figures and the history check's findings, and
// returns an error if the run was not safe.
func verdict(rep report, cfg config, out io.Writer) error {
	a := rep.audit
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	fmt.Fprintf(out, "\nsettled after: the start %v; a pause %v and a kill %v (bound %v); the return %v and a new worker %v (bound %v)\n",
		ms(rep.start), ms(rep.pause), ms(rep.kill), lossBound(cfg.ttl, cfg.period),
		ms(rep.resume), ms(rep.add), joinBound(cfg.period))
	fmt.Fprintf(out, "history: %d writes, %d handoffs, %d writes after their lock key was gone\n", a.writes, a.handoffs, a.late)
	if err := a.err(); err != nil {
		return fmt.Errorf("UNSAFE: %w", err)
	}
	if len(rep.refused) == 0 {
		return errors.New("the resumed worker's writes were not refused")
	}
	fmt.Fprintln(out, "fence records only went up; every write carried the token of the shard's newest claim, and every count follows the last: SAFE")
	return nil
}

// workerMain is a worker process: it runs until its stdin closes.
func workerMain(in io.Reader, out, errOut io.Writer) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { io.Copy(io.Discard, in); cancel() }()
	cfg, eps, err := workerFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	return runWorker(ctx, cli, cfg, out, errOut)
}

// workerFromEnv reads a worker's configuration from its environment.
func workerFromEnv(getenv func(string) string) (workerConfig, []string, error) {
	cfg := workerConfig{id: getenv(envID), keys: layout(getenv(envPrefix))}
	var errs []error
	var err error
	if cfg.shards, err = strconv.Atoi(getenv(envShards)); err != nil || cfg.shards < 1 {
		errs = append(errs, fmt.Errorf("%s %q: want a count", envShards, getenv(envShards)))
	}
	if cfg.ttl, err = time.ParseDuration(getenv(envTTL)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", envTTL, err))
	}
	if cfg.period, err = time.ParseDuration(getenv(envPeriod)); err != nil || cfg.period <= 0 {
		errs = append(errs, fmt.Errorf("%s %q: want a duration", envPeriod, getenv(envPeriod)))
	}
	if cfg.id == "" || cfg.keys == "" {
		errs = append(errs, fmt.Errorf("%s and %s must be set", envID, envPrefix))
	}
	return cfg, strings.Split(getenv(envEndpoints), ","), errors.Join(errs...)
}
