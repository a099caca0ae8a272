// Command scheduler runs three scheduler processes that campaign for
// leadership. The leader advances a job checkpoint in etcd, each write
// fenced by its leadership token. The command stops the leader (SIGSTOP)
// in the middle of its work, measures how long a standby takes to take
// over, resumes the old leader and shows its late write refused; then it
// kills the new leader (SIGKILL) and measures the takeover again.
//
// The exit status is 0 only if both takeovers happened, the resumed
// leader's write was refused, and the checkpoint only ever moved forward
// one step at a time.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

const (
	envEndpoints = "SCHEDULER_ENDPOINTS"
	envPrefix    = "SCHEDULER_PREFIX"
	envID        = "SCHEDULER_ID"
	envTTL       = "SCHEDULER_TTL"

	workTime = 200 * time.Millisecond // one job step; the stop lands in it
)

func main() {
	if os.Getenv(exampleenv.ChildEnv) == "scheduler" {
		if err := scheduler(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, os.Getenv(envID)+":", err)
			os.Exit(1)
		}
		return
	}
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of the schedulers")
	flag.Parse()
	if _, err := run(*endpoints, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

// report is what a run measured.
type report struct {
	takeoverStop, takeoverKill time.Duration
	refused                    bool
	checkpoints                []int64
}

// event is a line from one scheduler.
type event struct {
	who   string
	kind  string // LEADER, WORK, WROTE, REFUSED, LOST
	token int64
	rest  string
}

func run(endpoints string, ttl time.Duration, out io.Writer) (report, error) {
	var rep report
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, closeAll, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return rep, err
	}
	defer closeAll()
	prefix := fmt.Sprintf("scheduler-%x", time.Now().UnixNano()&0xffffff)
	start, err := cli.Get(ctx, prefix+"/checkpoint")
	if err != nil {
		return rep, err
	}
	history := watchCheckpoints(ctx, cli, prefix, start.Header.Revision+1)

	st, err := startSchedulers(ctx, cli, prefix, ttl, out)
	if err != nil {
		return rep, err
	}
	defer st.stop()
	second, err := st.stopLeaderMidStep(&rep)
	if err != nil {
		return rep, err
	}
	if err := st.killLeader(second, &rep); err != nil {
		return rep, err
	}
	st.stop()
	if rep.checkpoints, err = history(); err != nil {
		return rep, err
	}
	return rep, verify(rep, ttl, out)
}

// stage is the running story: three scheduler processes, their events, and
// the leaders an observer sees.
type stage struct {
	ctx      context.Context
	ttl      time.Duration
	tl       *exampleenv.Timeline
	obs      *lease.Observer
	children map[string]*exampleenv.Child
	events   chan event
	leaders  chan lease.Leader
	followed chan struct{} // closed when the observer's leaders are all printed
}

// startSchedulers starts three scheduler processes that campaign for the
// leadership, and an observer that reports each new leader.
func startSchedulers(ctx context.Context, cli *clientv3.Client, prefix string, ttl time.Duration, out io.Writer) (*stage, error) {
	obs, err := lease.Observe(ctx, cli, prefix+"/leader")
	if err != nil {
		return nil, err
	}
	st := &stage{ctx: ctx, ttl: ttl, tl: exampleenv.NewTimeline(out), obs: obs,
		children: map[string]*exampleenv.Child{}, events: make(chan event, 256), leaders: make(chan lease.Leader, 16),
		followed: make(chan struct{})}
	go func() {
		defer close(st.followed)
		defer close(st.leaders)
		for ld := range obs.Leaders() {
			st.tl.Printf("observer", "leader is %s, token %d", ld.Value, ld.Token)
			select {
			case st.leaders <- ld:
			default: // nobody waits for more leaders than the story has
			}
		}
	}()
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("sched-%d", i)
		c, err := exampleenv.StartChild(ctx, id, "scheduler",
			envEndpoints+"="+strings.Join(cli.Endpoints(), ","), envPrefix+"="+prefix,
			envID+"="+id, envTTL+"="+ttl.String())
		if err != nil {
			st.stop()
			return nil, err
		}
		st.children[id] = c
		go forward(c, st.events)
		st.tl.Printf(id, "started as process %d, campaigning", c.Pid())
	}
	return st, nil
}

// stop ends the children (a graceful quit, then a kill) and the observer,
// and waits until the observer's last leader is printed. It may be called
// more than once.
func (st *stage) stop() {
	for _, c := range st.children {
		c.Quit(st.ttl)
		c.Stop()
	}
	st.obs.Close()
	<-st.followed
}

// stopLeaderMidStep is round 1: the first leader works and is stopped with
// SIGSTOP in the middle of a step; a new leader takes over and writes; the
// first one resumes and its late write must be refused. It returns the
// second leader.
func (st *stage) stopLeaderMidStep(rep *report) (lease.Leader, error) {
	first, err := st.next(func(e event) bool { return e.kind == "LEADER" })
	if err != nil {
		return lease.Leader{}, err
	}
	if _, err := st.wrote(first.who, 3); err != nil {
		return lease.Leader{}, err
	}
	work, err := st.next(func(e event) bool { return e.who == first.who && e.kind == "WORK" })
	if err != nil {
		return lease.Leader{}, err
	}
	st.children[first.who].Signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	st.tl.Printf(first.who, "SIGSTOP in the middle of step %s (token %d)", work.rest, first.token)
	second, err := st.leaderAfter(first.token)
	if err != nil {
		return lease.Leader{}, err
	}
	rep.takeoverStop = time.Since(stoppedAt)
	st.tl.Printf(second.Value, "took over %v after the stop (TTL %v)", rep.takeoverStop.Round(time.Millisecond), st.ttl)
	if _, err := st.wrote(second.Value, 2); err != nil {
		return lease.Leader{}, err
	}
	st.children[first.who].Signal(syscall.SIGCONT)
	st.tl.Printf(first.who, "SIGCONT: resumes, finishes step %s and writes it with token %d", work.rest, first.token)
	ref, err := st.next(func(e event) bool { return e.who == first.who && (e.kind == "REFUSED" || e.kind == "WROTE") })
	if err != nil {
		return lease.Leader{}, err
	}
	rep.refused = ref.kind == "REFUSED"
	if rep.refused {
		st.tl.Printf(first.who, "late write REFUSED: %s", ref.rest)
	} else {
		st.tl.Printf(first.who, "late write ACCEPTED: the fence failed")
	}
	return second, nil
}

// killLeader is round 2: the leader is killed outright, and a third takes
// over and writes.
func (st *stage) killLeader(leader lease.Leader, rep *report) error {
	if _, err := st.wrote(leader.Value, 2); err != nil {
		return err
	}
	st.children[leader.Value].Signal(syscall.SIGKILL)
	killedAt := time.Now()
	st.tl.Printf(leader.Value, "SIGKILL")
	third, err := st.leaderAfter(leader.Token)
	if err != nil {
		return err
	}
	rep.takeoverKill = time.Since(killedAt)
	st.tl.Printf(third.Value, "took over %v after the kill (TTL %v)", rep.takeoverKill.Round(time.Millisecond), st.ttl)
	_, err = st.wrote(third.Value, 2)
	return err
}

// verify prints the figures and checks the story's ending: the late write
// refused, and every checkpoint step written once, in order.
func verify(rep report, ttl time.Duration, out io.Writer) error {
	fmt.Fprintf(out, "\ntakeover after SIGSTOP: %v, after SIGKILL: %v (TTL %v)\n",
		rep.takeoverStop.Round(time.Millisecond), rep.takeoverKill.Round(time.Millisecond), ttl)
	fmt.Fprintf(out, "checkpoints written, in commit order: %v\n", rep.checkpoints)
	if !rep.refused {
		return errors.New("the resumed leader's late write was not refused")
	}
	for i := 1; i < len(rep.checkpoints); i++ {
		if rep.checkpoints[i] != rep.checkpoints[i-1]+1 {
			return fmt.Errorf("checkpoint went from %d to %d", rep.checkpoints[i-1], rep.checkpoints[i])
		}
	}
	fmt.Fprintln(out, "every step written once, in order: SAFE")
	return nil
}

// next waits for the first event that match accepts.
func (st *stage) next(match func(event) bool) (event, error) {
	for {
		select {
		case ev := <-st.events:
			if match(ev) {
				return ev, nil
			}
		case <-st.ctx.Done():
			return event{}, st.ctx.Err()
		}
	}
}

// leaderAfter waits for a leader with a token above token.
func (st *stage) leaderAfter(token int64) (lease.Leader, error) {
	for {
		select {
		case ld, ok := <-st.leaders:
			if !ok {
				return lease.Leader{}, errors.New("observer stopped")
			}
			if ld.Token > token {
				return ld, nil
			}
		case <-st.ctx.Done():
			return lease.Leader{}, st.ctx.Err()
		}
	}
}

// wrote waits for n writes by who, and returns the last.
func (st *stage) wrote(who string, n int) (event, error) {
	var ev event
	for i := 0; i < n; i++ {
		var err error
		if ev, err = st.next(func(e event) bool { return e.who == who && e.kind == "WROTE" }); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

// forward turns a child's lines into events until it exits.
func forward(c *exampleenv.Child, events chan<- event) {
	for line := range c.Lines() {
		f := strings.SplitN(line, " ", 3)
		if len(f) < 2 {
			continue
		}
		tok, _ := strconv.ParseInt(f[1], 10, 64)
		ev := event{who: c.Name, kind: f[0], token: tok}
		if len(f) == 3 {
			ev.rest = f[2]
		}
		events <- ev
	}
}

// watchCheckpoints records every value the checkpoint takes from rev on.
// The returned function writes a marker key and returns the values seen
// before it, in commit order.
func watchCheckpoints(ctx context.Context, cli *clientv3.Client, prefix string, rev int64) func() ([]int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	wch := cli.Watch(wctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	return func() ([]int64, error) {
		defer cancel()
		if _, err := cli.Put(ctx, prefix+"/done", ""); err != nil {
			return nil, err
		}
		var vals []int64
		for wr := range wch {
			for _, ev := range wr.Events {
				switch string(ev.Kv.Key) {
				case prefix + "/checkpoint":
					v, _ := strconv.ParseInt(string(ev.Kv.Value), 10, 64)
					vals = append(vals, v)
				case prefix + "/done":
					return vals, nil
				}
			}
		}
		return vals, fmt.Errorf("checkpoint watch ended: %w", ctx.Err())
	}
}

// scheduler is a child process: campaign, then advance the checkpoint one
// step at a time, each write fenced by the leadership token; campaign again
// after losing. It stops cleanly when stdin closes.
func scheduler(in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { io.Copy(io.Discard, in); cancel() }()
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(envEndpoints), ","), DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	prefix, id := os.Getenv(envPrefix), os.Getenv(envID)
	// lease.Lead campaigns, calls schedule while leading, and campaigns
	// again whenever the leadership is lost.
	err = lease.Lead(ctx, cli, prefix+"/leader", id, func(ctx context.Context, l *lease.Leadership) error {
		return schedule(ctx, cli, prefix, l, out)
	}, lease.WithTTL(ttl))
	if ctx.Err() != nil {
		return nil // stdin closed: asked to stop
	}
	return err
}

// schedule runs job steps while leading: each step reads the checkpoint,
// works, and writes the next step fenced by the leadership's token. Its
// first read claims the checkpoint's fence record in the same transaction
// (fence.Claim): a plain read at the start of a leadership could be
// followed by a late write of the previous leader, which the record lets
// through until this leader's own first write raises it. It returns when
// the leadership ends (its ctx ends), or when a write or the claim is
// refused as stale (the leadership has ended even if this process has not
// noticed yet); lease.Lead then campaigns again.
func schedule(ctx context.Context, cli *clientv3.Client, prefix string, l *lease.Leadership, out io.Writer) error {
	tok := l.Token()
	fmt.Fprintln(out, "LEADER", tok)
	claimed := false
	for ctx.Err() == nil {
		g, err := readCheckpoint(ctx, cli, prefix, tok, claimed)
		if errors.Is(err, fence.ErrStale) {
			fmt.Fprintln(out, "REFUSED", tok, err)
			return err
		}
		if err != nil {
			continue
		}
		claimed = true
		var cp, modRev int64 // modRev 0: no checkpoint yet
		if len(g.Kvs) == 1 {
			cp, _ = strconv.ParseInt(string(g.Kvs[0].Value), 10, 64)
			modRev = g.Kvs[0].ModRevision
		}
		step := cp + 1
		fmt.Fprintln(out, "WORK", tok, step)
		time.Sleep(workTime) // the job step itself, which does not look at ctx
		// WriteContext: a write begun as leader gets the fence's verdict
		// even if the leadership ended meanwhile.
		wctx, cancel := l.WriteContext(ctx)
		resp, err := fence.NewTxn(wctx, cli, fence.Resource(prefix+"/checkpoint-fence", tok)).
			If(clientv3.Compare(clientv3.ModRevision(prefix+"/checkpoint"), "=", modRev)).
			Then(clientv3.OpPut(prefix+"/checkpoint", strconv.FormatInt(step, 10))).
			Commit()
		cancel()
		switch {
		case errors.Is(err, fence.ErrStale):
			fmt.Fprintln(out, "REFUSED", tok, err)
			return err
		case err != nil, !resp.Succeeded:
			continue // etcd unreachable, or the checkpoint moved: read again
		}
		fmt.Fprintln(out, "WROTE", tok, step)
	}
	fmt.Fprintln(out, "LOST", tok, context.Cause(ctx))
	return nil
}

// readCheckpoint reads the checkpoint; the leadership's first read claims
// its fence record in the same transaction, after which no earlier
// leader's write can land, and later reads need no claim.
func readCheckpoint(ctx context.Context, cli *clientv3.Client, prefix string, tok int64, claimed bool) (*clientv3.GetResponse, error) {
	if claimed {
		return cli.Get(ctx, prefix+"/checkpoint")
	}
	resp, err := fence.NewTxn(ctx, cli, fence.Claim(prefix+"/checkpoint-fence", tok)).
		Then(clientv3.OpGet(prefix + "/checkpoint")).
		Commit()
	if err != nil {
		return nil, err
	}
	return (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange()), nil
}
