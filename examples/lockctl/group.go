package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefence/leasefence/lease"
)

// groupPoll is how often a supervisor whose command has exited looks
// whether the rest of the command's process group is gone.
const groupPoll = 10 * time.Millisecond

// group is the command's process group, which lockctl run supervises.
type group struct {
	cmd       *exec.Cmd
	pgid      int
	killAfter time.Duration
}

// signal sends sig to every process in the group; one already gone is
// no error to anybody.
func (g *group) signal(sig syscall.Signal) { _ = syscall.Kill(-g.pgid, sig) }

// supervise forwards sigs to the group, stops the group when l is lost,
// and returns when the command and every process left in its group have
// exited: the command's exit status (128 + N if signal N killed it), and
// whether l was lost meanwhile.
func (g *group) supervise(l *lease.Lock, sigs <-chan os.Signal) (status int, lost bool) {
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = g.cmd.Wait()
	}()
	var (
		lossSeen <-chan struct{} = l.Done()
		kill     <-chan time.Time
		poll     <-chan time.Time
		leaderUp = true
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
			lossSeen, lost = nil, true
			g.signal(syscall.SIGTERM)
			g.signal(syscall.SIGCONT)
			t := time.NewTimer(g.killAfter)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			g.signal(syscall.SIGKILL)
		}
	}
	return exitStatus(g.cmd.ProcessState), lost
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
