package main

import (
	"bytes"
	"errors"
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

// groupPoll is how often a supervisor whose command has exited looks
// whether the rest of the command's process group is gone.
const groupPoll = 10 * time.Millisecond

// reapBound is how long run waits, after the SIGKILL that follows a loss,
// for the command's group to be gone before it exits all the same,
// naming what is left. SIGKILL ends a process within moments, but not a
// zombie, which only its parent can reap: one whose parent left the group
// (setsid, setpgid) and lives on without waiting for it keeps the group
// in being for as long as that parent lives. Nor a process stuck in an
// uninterruptible sleep (a hung network file system). Neither can touch
// the data any more.
const reapBound = 2 * time.Second

// group is the command's process group, which lockctl run supervises.
type group struct {
	cmd       *exec.Cmd
	pgid      int
	killAfter time.Duration
	term      bool // the group has lockctl's terminal (foregroundTerminal)
	// suspended is set from when lockctl stops itself with the group
	// until it is continued.
	suspended bool
}

// outcome is how a supervised command ended.
type outcome struct {
	status int  // the command's exit status, if it exited
	lost   bool // the lock was lost meanwhile
	// gaveUp says that run stopped waiting for the group reapBound after
	// SIGKILL; left are the processes /proc showed in it then.
	gaveUp bool
	left   []procInfo
}

// signal sends sig to every process in the group; one already gone is
// no error to anybody.
func (g *group) signal(sig syscall.Signal) { _ = syscall.Kill(-g.pgid, sig) }

// supervise forwards sigs to the group, suspends and resumes it with
// lockctl on jobs (jobControl), stops the group when l is lost, and
// returns when the command and every process left in its group have
// exited, or, after a loss, reapBound after SIGKILL at the latest.
func (g *group) supervise(l *lease.Lock, sigs, jobs <-chan os.Signal) outcome {
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = g.cmd.Wait()
	}()
	var (
		lossSeen           <-chan struct{} = l.Done()
		kill, poll, giveUp <-chan time.Time
		leaderUp           = true
		out                outcome
	)
	for leaderUp || g.alive() {
		select {
		case <-exited:
			exited, leaderUp = nil, false
			t := time.NewTicker(groupPoll)
			defer t.Stop()
			poll = t.C
		case <-poll:
		case sig := <-sigs:
			g.signal(sig.(syscall.Signal))
		case sig := <-jobs:
			if !out.lost { // a lost holder's group is being killed, not suspended
				g.jobControl(sig.(syscall.Signal))
			}
		case <-lossSeen:
			// The lock is gone and may soon be someone else's: stop the
			// command now, wake it if it was stopped so that it sees
			// SIGTERM, and kill what is left after the grace.
			lossSeen, out.lost = nil, true
			g.signal(syscall.SIGTERM)
			g.signal(syscall.SIGCONT)
			t := time.NewTimer(g.killAfter)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			g.signal(syscall.SIGKILL)
			t := time.NewTimer(reapBound)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			out.gaveUp, out.left = true, g.members()
			return out
		}
	}
	out.status = exitStatus(g.cmd.ProcessState)
	return out
}

// jobSignals are the signals jobControl handles: with the terminal, the
// command's group gets Ctrl-Z, and lockctl learns of it as a child's
// stop (SIGCHLD); without, only a SIGTSTP sent to lockctl suspends.
func jobSignals(term bool) []os.Signal {
	if term {
		return []os.Signal{syscall.SIGTSTP, syscall.SIGCONT, syscall.SIGCHLD}
	}
	return []os.Signal{syscall.SIGTSTP, syscall.SIGCONT}
}

// jobControl suspends the command's group with lockctl and resumes both,
// as a shell does a job, so that the shell that started lockctl sees its
// job stop and can resume it: SIGTSTP to lockctl, or the command's own
// stop at the terminal lockctl gave it (Ctrl-Z), stops both; SIGCONT to
// lockctl (the shell's fg or bg) resumes both. A stopped lockctl renews
// nothing: a suspend longer than the TTL loses the lock, and lockctl acts
// on the loss once resumed.
func (g *group) jobControl(sig syscall.Signal) {
	switch sig {
	case syscall.SIGTSTP:
		g.signal(syscall.SIGTSTP)
		g.suspend()
	case syscall.SIGCHLD:
		// Also reported when lockctl's own SIGTSTP stopped the command:
		// then lockctl is suspended already.
		if g.leaderStopped() && !g.suspended {
			g.suspend()
		}
	case syscall.SIGCONT:
		g.suspended = false
		if g.term && foregroundTerminal() {
			// fg gave lockctl's group the terminal: the command had it.
			setForeground(g.pgid)
		}
		g.signal(syscall.SIGCONT)
	}
}

// suspend stops lockctl, after taking back the terminal that the
// command's group had, for the shell to take from lockctl's group.
func (g *group) suspend() {
	g.suspended = true
	if g.term {
		takeTerminalBack(g.pgid)
	}
	// SIGSTOP, not SIGTSTP: once os/signal has had SIGTSTP, Go's handler
	// stays and drops it, signal.Reset or not; and the kernel drops a
	// SIGTSTP to a process group no shell controls (an orphaned one),
	// which would leave the command stopped under a running lockctl.
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// leaderStopped tells whether the command itself has stopped, and
// consumes the report; it leaves its exit to cmd.Wait.
func (g *group) leaderStopped() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, g.pgid, &info, unix.WSTOPPED|unix.WNOHANG, nil)
	return err == nil && info.Signo != 0
}

// alive reaps the group's exited orphans (lockctl is their subreaper)
// and tells whether any process is left in the group.
func (g *group) alive() bool {
	for {
		pid, err := unix.Wait4(-g.pgid, nil, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return !errors.Is(syscall.Kill(-g.pgid, 0), syscall.ESRCH)
}

// procInfo is a process as /proc/PID/stat tells it.
type procInfo struct {
	pid, ppid, pgrp int
	state           byte // as ps shows it: R, S, D, T, Z...
}

func (p procInfo) String() string {
	if p.state == 'Z' {
		return fmt.Sprintf("%d (a zombie, which only its parent %d can reap)", p.pid, p.ppid)
	}
	return fmt.Sprintf("%d (state %c)", p.pid, p.state)
}

// readStat reads process pid's state, parent and group from
// /proc/PID/stat: the fields after its command name, which is in
// parentheses and may hold spaces and parentheses itself.
func readStat(pid int) (procInfo, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	p := procInfo{pid: pid, state: f[0][0]}
	p.ppid, err = strconv.Atoi(f[1])
	if err == nil {
		p.pgrp, err = strconv.Atoi(f[2])
	}
	return p, err
}

// members lists the processes in the group, as far as /proc shows them.
func (g *group) members() []procInfo {
	ents, _ := os.ReadDir("/proc")
	var in []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		if p, err := readStat(pid); err == nil && p.pgrp == g.pgid {
			in = append(in, p)
		}
	}
	return in
}

// exitStatus is a shell's $? for a process that ended as ps says.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return ps.ExitCode()
}

// foregroundTerminal tells whether lockctl's standard input is a terminal
// whose foreground process group is lockctl's: then the command gets the
// terminal, so that it can read it and Ctrl-C reaches it.
func foregroundTerminal() bool {
	fg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && fg == syscall.Getpgrp()
}

// takeTerminalBack makes lockctl's group the terminal's foreground again
// if the command's group pgid has it, as a shell does after a job. After
// a bg, the shell has it, and keeps it.
func takeTerminalBack(pgid int) {
	if fg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP); err == nil && fg == pgid {
		setForeground(syscall.Getpgrp())
	}
}

// setForeground makes pgid the terminal's foreground group. A background
// group that does this gets SIGTTOU, hence the ignore.
func setForeground(pgid int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pgid)
}
