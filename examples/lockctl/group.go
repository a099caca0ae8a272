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

// supervise forwards sigs to the group, stops the group when l is lost,
// and returns when the command and every process left in its group have
// exited, or, after a loss, reapBound after SIGKILL at the latest.
func (g *group) supervise(l *lease.Lock, sigs <-chan os.Signal) outcome {
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
// after the command's group had it, as a shell does after a job. A
// background group that does this gets SIGTTOU, hence the ignore.
func takeTerminalBack() {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, syscall.Getpgrp())
}
