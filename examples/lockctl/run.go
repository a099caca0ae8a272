package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefence/leasefence/lease"
)

// runFlags is what lockctl run is asked to do.
type runFlags struct {
	ttl, wait, killAfter, lockDelay time.Duration
	noWait, quiet, verbose          bool
	owner, record                   string
	name                            string
	argv                            []string
}

// Defaults of run's periods. A lost holder's child gets SIGTERM no later
// than etcd expires its lease, and SIGKILL killAfter later; the next
// holder waits the holding's delay after it learned of the loss. That
// delay must cover the TTL too: a lease revoked while its holder is cut
// off from etcd is only known lost at the holder's own deadline, up to a
// TTL later. So a holding asks its successors for TTL + killAfter +
// delayMargin, from the TTL etcd granted, or -lock-delay if longer; the
// library makes every successor wait the longer of that and its own.
const (
	defaultRunTTL    = 5 * time.Second
	defaultKillAfter = 10 * time.Second
	// delayMargin is what the delay keeps beyond the TTL and the kill
	// grace: clock rates, the supervisor's own reaction time.
	delayMargin = time.Second
)

// holdingDelay is the lock delay of a run whose session etcd granted ttl:
// what its holding asks of its successors, and the least it waits out.
func holdingDelay(r runFlags, ttl time.Duration) time.Duration {
	return max(r.lockDelay, ttl+r.killAfter+delayMargin)
}

var runCommand = command{
	name: "run", synopsis: "run [flags] NAME -- COMMAND [ARGS...]", arg: "NAME",
	about: "hold lock NAME while COMMAND runs; stop COMMAND at once if the lock is lost",
	flags: func(fs *flag.FlagSet, inv *invocation) {
		r := &inv.run
		fs.DurationVar(&r.ttl, "ttl", defaultRunTTL, "the session's lease `TTL`: how long a holder cut off from etcd keeps the lock")
		fs.DurationVar(&r.wait, "wait", 0, "give up after `DURATION` if the lock is still held (exit 75); 0 waits for ever")
		fs.BoolVar(&r.noWait, "no-wait", false, "give up at once if the lock is held (exit 75)")
		fs.DurationVar(&r.killAfter, "kill-after", defaultKillAfter, "after the lock is lost, SIGKILL the command's group `DURATION` after SIGTERM")
		fs.DurationVar(&r.lockDelay, "lock-delay", 0, "after a loss, the next holder starts its command at least `DURATION` later; 0: -ttl + -kill-after + 1s, the least a holding always asks")
		fs.BoolVar(&r.quiet, "q", false, "print nothing while waiting (the lines run prints when it starts waiting, behind whom, and for a lock delay)")
		fs.BoolVar(&r.verbose, "v", false, "print more while waiting and holding: the grant, the command's start, the release")
		fs.StringVar(&r.owner, "owner", "", "name the holder `OWNER` for lockctl show and list")
		fs.StringVar(&r.record, "record", "", "a fence record `KEY` for lockctl put, passed as LEASEFENCE_RECORD")
	},
	args: runArgs,
	help: writeRunHelp,
	run:  func(ctx context.Context, c *ctl, inv invocation) error { return c.runHolding(ctx, inv.run) },
}

// runArgs checks run's flags and reads NAME -- COMMAND [ARGS...].
func runArgs(inv *invocation, args []string) error {
	r := &inv.run
	if len(args) > 1 && args[1] == "--" {
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 {
		return usageErrorf("run takes NAME -- COMMAND [ARGS...] (its flags go before NAME)")
	}
	r.name, r.argv = args[0], args[1:]
	return checkRunFlags(r)
}

func checkRunFlags(r *runFlags) error {
	switch {
	case r.name == "":
		return usageErrorf("run: empty NAME")
	case r.argv[0] == "":
		return usageErrorf("run: empty COMMAND")
	case r.noWait && r.wait != 0:
		return usageErrorf("run: -wait and -no-wait together")
	case r.wait < 0:
		return usageErrorf("run: -wait %v: want 0 (for ever) or more", r.wait)
	case r.ttl < time.Second:
		return usageErrorf("run: -ttl %v: want at least 1s", r.ttl)
	case r.killAfter <= 0:
		return usageErrorf("run: -kill-after %v: want more than 0", r.killAfter)
	case r.lockDelay < 0 || r.lockDelay > lease.MaxLockDelay:
		return usageErrorf("run: -lock-delay %v: want 0 to %v", r.lockDelay, lease.MaxLockDelay)
	case holdingDelay(*r, r.ttl) > lease.MaxLockDelay:
		return usageErrorf("run: -ttl + -kill-after + %v = %v: want at most %v, the longest lock delay",
			delayMargin, r.ttl+r.killAfter+delayMargin, lease.MaxLockDelay)
	case r.quiet && r.verbose:
		return usageErrorf("run: -q and -v together")
	}
	return nil
}

// errWaited ends a -wait that ran out.
var errWaited = errors.New("waited long enough")

// signalled is the cause of a wait that a signal to lockctl ended.
type signalled struct{ sig syscall.Signal }

func (s signalled) Error() string { return "got " + s.sig.String() }

// runHolding takes the lock, runs the command under it and stops the
// command if the lock is lost. Its error carries the exit status.
func (c *ctl) runHolding(ctx context.Context, r runFlags) error {
	// Orphans of the command's group are ours to reap, so that the holding
	// lasts until the last of them is gone.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// Until the command starts, a signal to lockctl ends the run: while the
	// lease is granted as well as while the lock is awaited.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig := <-c.sigs:
			cancel(signalled{sig.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	s, l, err := c.take(ctx, r)
	cancel(nil)
	<-watched
	if s != nil {
		defer s.Close()
	}
	var sig signalled
	if errors.As(context.Cause(ctx), &sig) {
		// Also when the lock came at the same time: the signal asked to
		// stop, and the command has not started.
		if l != nil {
			c.unlock(l)
		}
		return exitWith(exitSignal+int(sig.sig), fmt.Errorf("run %s: %v before the command started; it did not run", r.name, sig.sig))
	}
	if errors.Is(err, lease.ErrLost) {
		// Lost before the command started, mostly while run waited out
		// a lock delay after the grant: the same loss as while the
		// command runs, only sooner.
		return lostError(r, err, r.argv[0]+" did not run")
	}
	if err != nil {
		return err
	}
	return c.runUnder(l, s, r)
}

// lostError is run's error for a loss of lock r.name, whose cause is err
// (wrapping lease.ErrLost), before or after the command started: exit
// status 124 and one message, whatever the moment, which ends with what
// became of the command.
func lostError(r runFlags, err error, command string) error {
	return exitWith(exitLost, fmt.Errorf("run %s: lost the lock (%v); %s", r.name, lossCause(err), command))
}

// lossCause is the part of err that says how the lock was lost: the
// package's own error (lease.ErrKeyDeleted, lease.ErrLeaseExpired with
// its reason...) without the name of the call that returned it, so that
// a loss reads the same whether Lock returned it or the holding ended.
func lossCause(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.HasPrefix(e.Error(), lease.ErrLost.Error()) {
			return e
		}
	}
	return err
}

// take opens the session, within -timeout, and waits for the lock as r
// says, until ctx ends, telling on stderr what it waits for (narrator).
// The session is returned whenever it was opened.
func (c *ctl) take(ctx context.Context, r runFlags) (*lease.Session, *lease.Lock, error) {
	n := newNarrator(c.cli, r, os.Stderr)
	defer n.stop()
	s, err := c.open(ctx, r, n, r.ttl)
	if err == nil && holdingDelay(r, s.TTL()) > holdingDelay(r, r.ttl) {
		// etcd granted a longer TTL than asked (its minimum): the delay
		// the holding asks must cover the granted one.
		s.Close()
		s, err = c.open(ctx, r, n, s.TTL())
	}
	if err != nil {
		if unanswered(err) {
			return nil, nil, exitWith(exitUnavailable, err)
		}
		return nil, nil, err
	}
	n.opened(s.Lease())
	wctx := ctx
	if r.wait > 0 {
		var stopWait context.CancelFunc
		wctx, stopWait = context.WithTimeoutCause(ctx, r.wait, errWaited)
		defer stopWait()
	}
	var l *lease.Lock
	if r.noWait {
		l, err = s.TryLock(wctx, r.name)
	} else {
		l, err = s.Lock(wctx, r.name)
	}
	switch {
	case err == nil:
		n.granted(l)
		return s, l, nil
	case errors.Is(err, lease.ErrLocked):
		return s, nil, exitWith(exitBusy, fmt.Errorf("run: %w", err))
	case errors.Is(context.Cause(wctx), errWaited):
		return s, nil, exitWith(exitBusy, fmt.Errorf("run %s: still held after -wait %v; the command did not run", r.name, r.wait))
	case unanswered(err):
		return s, nil, exitWith(exitUnavailable, err)
	}
	return s, nil, err
}

// open opens run's session within -timeout, with the lock delay a TTL
// of ttl needs and the narrator's hooks.
func (c *ctl) open(ctx context.Context, r runFlags, n *narrator, ttl time.Duration) (*lease.Session, error) {
	opts := []lease.Option{lease.WithTTL(r.ttl), lease.WithLockDelay(holdingDelay(r, ttl)), lease.WithHooks(n.hooks())}
	if r.owner != "" {
		opts = append(opts, lease.WithOwner(r.owner))
	}
	gctx, stop := context.WithTimeout(ctx, c.cfg.timeout)
	defer stop()
	return lease.NewSession(gctx, c.cli, opts...)
}

// unlock releases l, guarded by its token, and says so if it could not.
func (c *ctl) unlock(l *lease.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.timeout)
	defer cancel()
	if err := l.Unlock(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "lockctl:", err)
	}
}

// holdingEnv is the environment the command gets: lockctl's own, with the
// holding in it.
func (c *ctl) holdingEnv(l *lease.Lock, r runFlags, s *lease.Session) []string {
	eps, _ := c.cfg.resolveEndpoints()
	token := strconv.FormatInt(l.Token(), 10)
	set := map[string]string{
		"LEASEFENCE_LOCK":      l.Name(),
		"LEASEFENCE_KEY":       l.Key(),
		"LEASEFENCE_TOKEN":     token,
		"LEASEFENCE_LEASE":     strconv.FormatInt(int64(s.Lease()), 16),
		"LEASEFENCE_ENDPOINTS": strings.Join(eps, ","),
		// For scripts written for etcdctl lock; the revision is the key's
		// creation revision, the fencing token (etcdctl gives its
		// response's revision, which is not one).
		"ETCD_LOCK_KEY": l.Key(),
		"ETCD_LOCK_REV": token,
	}
	if r.record != "" {
		set["LEASEFENCE_RECORD"] = r.record
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); set[k] == "" && !strings.HasPrefix(k, "LEASEFENCE_") {
			env = append(env, kv)
		}
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// runUnder runs the command while l is held and releases l after. Its
// error carries the exit status.
func (c *ctl) runUnder(l *lease.Lock, s *lease.Session, r runFlags) error {
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = c.holdingEnv(l, r, s)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	term := foregroundTerminal()
	if term {
		// The command reads the terminal, as it would without lockctl.
		cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, 0
	}
	// Job control from the start on: before it, SIGTSTP stops lockctl
	// alone, all there is to stop.
	jobs := make(chan os.Signal, 8)
	signal.Notify(jobs, jobSignals(term)...)
	defer signal.Stop(jobs)
	if err := cmd.Start(); err != nil {
		c.unlock(l)
		return exitWith(startFailure(err), fmt.Errorf("run %s: %w", r.name, err))
	}
	if r.verbose {
		fmt.Fprintf(os.Stderr, "lockctl: run %s: started %s, pid %d\n", r.name, r.argv[0], cmd.Process.Pid)
	}
	g := &group{cmd: cmd, pgid: cmd.Process.Pid, killAfter: r.killAfter, term: term}
	out := g.supervise(l, c.sigs, jobs)
	if term {
		takeTerminalBack(g.pgid)
	}
	if out.lost {
		return lostError(r, l.Err(), stopped(r.argv[0], g.pgid, out))
	}
	c.unlock(l)
	if r.verbose {
		fmt.Fprintf(os.Stderr, "lockctl: run %s: %s exited %d; released the lock\n", r.name, r.argv[0], out.status)
	}
	return exitWith(out.status, nil)
}

// stopped says what run did to the command after a loss: stopped it,
// and if it gave up on processes still in its group reapBound after
// SIGKILL, which.
func stopped(command string, pgid int, out outcome) string {
	if !out.gaveUp {
		return "stopped " + command
	}
	left := "processes that /proc did not show"
	if len(out.left) > 0 {
		pids := make([]string, len(out.left))
		for i, p := range out.left {
			pids[i] = "pid " + p.String()
		}
		left = strings.Join(pids, ", ")
	}
	return fmt.Sprintf("stopped %s, but %v after SIGKILL its group %d still held %s; not waiting longer for them",
		command, reapBound, pgid, left)
}

// startFailure is the exit status for a command that did not start, as a
// shell gives it.
func startFailure(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return exitNotFound
	}
	return exitNoExec
}
