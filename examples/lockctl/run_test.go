package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// lockctlBin is the lockctl binary the tests run as a process, built by
// TestMain.
var lockctlBin string

func buildLockctl(dir string) int {
	lockctlBin = filepath.Join(dir, "lockctl")
	out, err := exec.Command("go", "build", "-o", lockctlBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build lockctl: %v\n%s", err, out)
		return 1
	}
	return 0
}

// proc is a lockctl process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	exited         chan struct{}
}

// startLockctl starts lockctl with args after -endpoints eps (the test's
// etcd if nil).
func startLockctl(t *testing.T, eps []string, args ...string) *proc {
	t.Helper()
	p := newLockctl(eps, args...)
	p.start(t)
	return p
}

// newLockctl is startLockctl's lockctl, not yet started: a test may
// change its environment or process attributes first.
func newLockctl(eps []string, args ...string) *proc {
	if eps == nil {
		eps = etcd.Endpoints()
	}
	p := &proc{exited: make(chan struct{})}
	p.cmd = exec.Command(lockctlBin, append([]string{"-endpoints", strings.Join(eps, ",")}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// A process that left the command's group may outlive lockctl with
	// the output pipes open: lockctl's exit is what the tests wait for.
	p.cmd.WaitDelay = time.Second
	p.cmd.Env = append(os.Environ(), "LEASEFENCE_TOKEN=", "LEASEFENCE_RECORD=")
	return p
}

// start starts p, and kills it at the end of the test if it is still
// running.
func (p *proc) start(t *testing.T) {
	t.Helper()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
}

// wait returns lockctl's exit status, failing the test if it takes more
// than d.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("lockctl %v still running after %v", p.cmd.Args[3:], d)
	}
	t.Logf("lockctl %v: exit %d, stderr %q", p.cmd.Args[3:], p.cmd.ProcessState.ExitCode(), p.stderr.String())
	return p.cmd.ProcessState.ExitCode()
}

// awaitFile waits until path exists with some content, and returns it.
func awaitFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && bytes.HasSuffix(b, []byte("\n")) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitFile waits until p's command wrote path, failing the test if p
// exits first.
func (p *proc) awaitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return string(b)
		}
		select {
		case <-p.exited:
			t.Fatalf("lockctl %v exited %d before writing %s: %s", p.cmd.Args[3:], p.cmd.ProcessState.ExitCode(), path, p.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within 20s", path)
		}
	}
}

// awaitHolder waits until name has a holder other than not, and returns it.
func awaitHolder(t *testing.T, cli *clientv3.Client, name string, not int64) lease.QueueEntry {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		q, err := lease.Inspect(context.Background(), cli, name)
		if err == nil && len(q) > 0 && q[0].Token != not {
			return q[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new holder of %s: %v %v", name, q, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunEnvironment(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	out, finish := filepath.Join(t.TempDir(), "env"), filepath.Join(t.TempDir(), "finish")
	p := startLockctl(t, nil, "run", "-owner", "backup@ops-1", "-record", name+"-record", name, "--",
		"sh", "-c", `env | grep -E '^(LEASEFENCE|ETCD_LOCK)_' | sort > "$0.tmp"; echo done >> "$0.tmp"; mv "$0.tmp" "$0"; while [ ! -e "$1" ]; do sleep 0.02; done`, out, finish)
	got := awaitFile(t, out, 20*time.Second)
	h := awaitHolder(t, cli, name, 0)
	resp, err := cli.Get(context.Background(), h.Key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("holder's key: %v %v", resp, err)
	}
	tok := strconv.FormatInt(resp.Kvs[0].CreateRevision, 10)
	want := []string{
		"ETCD_LOCK_KEY=" + h.Key, "ETCD_LOCK_REV=" + tok,
		"LEASEFENCE_ENDPOINTS=" + strings.Join(etcd.Endpoints(), ","), "LEASEFENCE_KEY=" + h.Key,
		"LEASEFENCE_LEASE=" + strconv.FormatInt(int64(h.Lease), 16), "LEASEFENCE_LOCK=" + name,
		"LEASEFENCE_RECORD=" + name + "-record", "LEASEFENCE_TOKEN=" + tok, "done",
	}
	if got != strings.Join(want, "\n")+"\n" {
		t.Errorf("environment:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if h.Owner != "backup@ops-1" {
		t.Errorf("owner %q", h.Owner)
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if q, err := lease.Inspect(context.Background(), cli, name); err != nil || len(q) != 0 {
		t.Errorf("after run: queue %v %v, want released", q, err)
	}
}

func TestRunExitStatus(t *testing.T) {
	noexec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		code int
	}{
		{"ok", []string{"true"}, 0},
		{"status", []string{"sh", "-c", "exit 7"}, 7},
		{"killed by a signal", []string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"terminated", []string{"sh", "-c", "kill -TERM $$"}, 128 + 15},
		{"not found", []string{"no-such-command-here"}, exitNotFound},
		{"not executable", []string{noexec}, exitNoExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := etcdproc.Name(t, "job")
			p := startLockctl(t, nil, append([]string{"run", name, "--"}, tc.argv...)...)
			if code := p.wait(t, 20*time.Second); code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			q, err := lease.Inspect(context.Background(), etcd.Client(t), name)
			if err != nil || len(q) != 0 {
				t.Errorf("after run: queue %v %v, want released", q, err)
			}
		})
	}
}

func TestRunBusy(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	s := session(t, cli)
	if _, err := s.Lock(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, tc := range []struct {
		flags         []string
		least, within time.Duration
	}{
		{[]string{"-no-wait"}, 0, 3 * time.Second},
		{[]string{"-wait", "700ms"}, 700 * time.Millisecond, 4 * time.Second},
	} {
		start := time.Now()
		p := startLockctl(t, nil, append(append([]string{"run"}, tc.flags...), name, "--", "touch", marker)...)
		code := p.wait(t, 20*time.Second)
		took := time.Since(start)
		if code != exitBusy {
			t.Errorf("%v: exit %d, want %d", tc.flags, code, exitBusy)
		}
		if took < tc.least || took > tc.within {
			t.Errorf("%v: gave up after %v, want %v to %v", tc.flags, took, tc.least, tc.within)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%v: the command ran", tc.flags)
		}
	}
}

// TestRunForwardsTerm: SIGTERM to lockctl reaches the command, whose
// status lockctl exits with, and the lock goes to the next run.
func TestRunForwardsTerm(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	dir := t.TempDir()
	up, second := filepath.Join(dir, "up"), filepath.Join(dir, "second")
	first := startLockctl(t, nil, "run", name, "--", "sh", "-c",
		`trap 'exit 3' TERM; echo up > "$0"; while :; do sleep 0.05; done`, up)
	awaitFile(t, up, 20*time.Second)
	h := awaitHolder(t, cli, name, 0)
	next := startLockctl(t, nil, "run", name, "--", "sh", "-c", `echo "$LEASEFENCE_TOKEN" > "$0"`, second)
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(t, 20*time.Second); code != 3 {
		t.Fatalf("first: exit %d, want the command's 3", code)
	}
	if code := next.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("next: exit %d", code)
	}
	tok, err := strconv.ParseInt(strings.TrimSpace(awaitFile(t, second, time.Second)), 10, 64)
	if err != nil || tok <= h.Token {
		t.Fatalf("next holder's token %d (%v), want above %d", tok, err, h.Token)
	}
}

func TestRunUnreachable(t *testing.T) {
	addr := closedPort(t)
	start := time.Now()
	p := startLockctl(t, []string{addr}, "-timeout", "300ms", "run", "x", "--", "true")
	code := p.wait(t, 10*time.Second)
	if code != exitUnavailable {
		t.Errorf("exit %d, want %d", code, exitUnavailable)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v with -timeout 300ms", took)
	}
	if want := "etcd at " + addr + " (from -endpoints) did not answer within 300ms"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr %q, want it to say %q", p.stderr.String(), want)
	}
}
