package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// helperEnv, set in the environment, makes the test binary a helper
// process that a test's command runs (runHelper) instead of the tests.
const helperEnv = "LOCKCTL_TEST_HELPER"

// runHelper is the test binary run as helper mode, with args; it returns
// the exit status.
func runHelper(mode string, args []string) int {
	switch mode {
	case "zombie-parent":
		return zombieParent(args[0])
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", mode)
	return 2
}

// zombieParent starts a child that exits at once, leaves its process
// group without reaping it, and writes "CHILD PARENT" (the pids) to path:
// the child is left in the group as a zombie that only this process,
// outside the group now, can reap. It lives a minute at most; the test
// kills it sooner.
func zombieParent(path string) int {
	child := exec.Command("true")
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := syscall.Setpgid(0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", child.Process.Pid, os.Getpid()), 0o644); err != nil || os.Rename(tmp, path) != nil {
		return 1
	}
	time.Sleep(time.Minute) // its lifetime, not a wait for an event
	return 0
}

// awaitState waits until /proc says that process pid is in a state
// among states (ps's letters: R, S, T, Z...), failing the test after d.
func awaitState(t *testing.T, pid int, states string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := readStat(pid)
		if err == nil && strings.IndexByte(states, st.state) >= 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d: state %c (%v), want one of %q within %v", pid, st.state, err, states, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunLossZombieLeftBehind: the command leaves a zombie in its group
// whose parent left the group and never reaps it, so the group never
// empties. After a loss, run gives up on it reapBound after SIGKILL and
// exits 124, naming the zombie.
func TestRunLossZombieLeftBehind(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	pids := filepath.Join(t.TempDir(), "pids")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// sh, the group's leader, waits for the helper, which has left the
	// group: SIGTERM ends sh, and the zombie stays.
	p := startLockctl(t, nil, append(slices.Clone(lossFlags), name, "--", "sh", "-c",
		helperEnv+`=zombie-parent "$0" "$1" </dev/null >/dev/null 2>&1`+"\nexit 0", self, pids)...)
	var zombie, parent int
	if _, err := fmt.Sscan(p.awaitFile(t, pids), &zombie, &parent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(parent, syscall.SIGKILL) })
	awaitState(t, zombie, "Z", 10*time.Second)
	h := awaitHolder(t, cli, name, 0)
	lossAt := time.Now()
	if _, err := cli.Revoke(context.Background(), h.Lease); err != nil {
		t.Fatal(err)
	}
	// -kill-after 1s, then reapBound, and slack for lockctl to see the
	// loss and exit.
	if code := p.wait(t, 1*time.Second+reapBound+5*time.Second); code != exitLost {
		t.Fatalf("exit %d, want %d", code, exitLost)
	}
	took := time.Since(lossAt)
	if took < time.Second+reapBound {
		t.Errorf("exited %v after the loss, before -kill-after and reapBound", took)
	}
	msg := p.stderr.String()
	if !strings.Contains(msg, " "+strconv.Itoa(zombie)+" (a zombie") || !strings.Contains(msg, strconv.Itoa(parent)) {
		t.Fatalf("stderr %q does not name the zombie %d and its parent %d", msg, zombie, parent)
	}
}

// TestRunSuspend: SIGTSTP to run (here without a terminal, as kill -TSTP
// sends it) stops the command's group and run itself; SIGCONT to run
// resumes both, and the command goes on to finish under the lock, which
// run held throughout.
func TestRunSuspend(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	dir := t.TempDir()
	pidFile, fifo, out := filepath.Join(dir, "pid"), filepath.Join(dir, "fifo"), filepath.Join(dir, "out")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startLockctl(t, nil, "run", name, "--", "sh", "-c",
		`echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; read x < "$1"; echo "$x $LEASEFENCE_TOKEN" > "$2"`, pidFile, fifo, out)
	child, err := strconv.Atoi(strings.TrimSpace(p.awaitFile(t, pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	run := p.cmd.Process.Pid
	h := awaitHolder(t, cli, name, 0)
	if err := syscall.Kill(run, syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	awaitState(t, run, "T", 10*time.Second)
	awaitState(t, child, "T", 10*time.Second)
	if q, err := lease.Inspect(context.Background(), cli, name); err != nil || len(q) == 0 || q[0].Token != h.Token {
		t.Fatalf("while suspended: queue %v %v, want the lock still held with token %d", q, err, h.Token)
	}
	if err := syscall.Kill(run, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitState(t, run, "RS", 10*time.Second)
	awaitState(t, child, "RS", 10*time.Second)
	// The child, running again, opens the fifo for its read.
	writeFifo(t, fifo, "resumed\n")
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d, want the command's 0", code)
	}
	if got, want := awaitFile(t, out, time.Second), fmt.Sprintf("resumed %d\n", h.Token); got != want {
		t.Fatalf("the command wrote %q, want %q", got, want)
	}
}

// writeFifo writes s to the fifo at path once a reader has it open,
// failing the test if none does within 10s.
func writeFifo(t *testing.T, path, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Non-blocking: the open fails with ENXIO until a reader has
		// the fifo open, rather than hanging the test.
		f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_, err = f.WriteString(s)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if !errors.Is(err, syscall.ENXIO) || time.Now().After(deadline) {
			t.Fatalf("fifo %s: %v", path, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunSuspendAtTerminal: Ctrl-Z at the terminal, which run handed to
// the command, stops the command's group; run sees it stop, takes the
// terminal back and stops too, as a shell's job does. SIGCONT to run (a
// shell's fg) hands the terminal to the command again and resumes it,
// and the command reads the terminal to its end.
func TestRunSuspendAtTerminal(t *testing.T) {
	ptm, pts := openPty(t)
	name := etcdproc.Name(t, "job")
	dir := t.TempDir()
	pidFile, out := filepath.Join(dir, "pid"), filepath.Join(dir, "out")
	p := newLockctl(nil, "run", name, "--", "sh", "-c", `echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; read x; echo "$x" > "$1"`, pidFile, out)
	// lockctl in a session of its own, with the pty as its controlling
	// terminal and its standard input, as a shell's job at a terminal.
	p.cmd.Stdin = pts
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	p.start(t)
	child, err := strconv.Atoi(strings.TrimSpace(p.awaitFile(t, pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	run := p.cmd.Process.Pid
	awaitForeground(t, ptm, child)
	if _, err := ptm.Write([]byte{0x1a}); err != nil { // Ctrl-Z: VSUSP
		t.Fatal(err)
	}
	awaitState(t, child, "T", 10*time.Second)
	awaitState(t, run, "T", 10*time.Second)
	awaitForeground(t, ptm, run)
	if err := syscall.Kill(run, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitForeground(t, ptm, child)
	awaitState(t, child, "RS", 10*time.Second)
	awaitState(t, run, "RS", 10*time.Second)
	if _, err := ptm.Write([]byte("resumed\n")); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d, want the command's 0", code)
	}
	if got := awaitFile(t, out, time.Second); got != "resumed\n" {
		t.Fatalf("the command read %q from the terminal, want %q", got, "resumed\n")
	}
}

// openPty opens a pseudo-terminal: its master and its slave, closed at
// the end of the test.
func openPty(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}

// awaitForeground waits until the terminal of ptm has process group
// pgid in the foreground.
func awaitForeground(t *testing.T, ptm *os.File, pgid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fg, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPGRP)
		if err == nil && fg == pgid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal's foreground group is %d (%v), want %d", fg, err, pgid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
