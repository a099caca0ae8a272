package main

import (
	"context"
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

	"github.com/leasefence/leasefence/internal/etcdproc"
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
