package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

var etcd etcdproc.Env

// bin holds the lockctl and oneshot binaries the tests run.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oneshot-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	code := 0
	for _, b := range [][]string{
		{"-o", filepath.Join(dir, "oneshot"), "."},
		{"-o", filepath.Join(dir, "lockctl"), "github.com/leasefence/leasefence/examples/lockctl"},
	} {
		if out, err := exec.Command("go", append([]string{"build"}, b...)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %v: %v\n%s", b, err, out)
			code = 1
		}
	}
	if code == 0 {
		code = etcd.Main(m, etcdproc.Config{})
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// exitCode runs cmd and returns its exit status and output.
func exitCode(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s\n%s", strings.Join(cmd.Args, " "), out)
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// The job under lockctl run writes with its token; a second run raises
// the record; the first run's token, presented late, is refused and
// changes nothing.
func TestOneshotUnderRun(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "nightly")
	record, key := name+"-fence", name+"-last-run"
	eps := strings.Join(etcd.Endpoints(), ",")
	runJob := func(value string) (int, string) {
		return exitCode(t, exec.Command(filepath.Join(bin, "lockctl"), "-endpoints", eps,
			"run", "-record", record, name, "--", filepath.Join(bin, "oneshot"), key, value))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The token each run wrote with, from the job's own output.
	tokenOf := func(out string) int64 {
		_, num, ok := strings.Cut(strings.TrimSpace(out), " with token ")
		n, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			t.Fatalf("no token in the job's output %q", out)
		}
		return n
	}
	code, out := runJob("first")
	if code != 0 || !strings.Contains(out, "wrote "+key) {
		t.Fatalf("first run: exit %d", code)
	}
	first := tokenOf(out)
	code, out = runJob("second")
	if code != 0 {
		t.Fatalf("second run: exit %d", code)
	}
	if second := tokenOf(out); second <= first {
		t.Fatalf("the second run wrote with token %d, want more than the first's %d", second, first)
	}
	// The first run's write, arriving late (its holder paused past its
	// lease), with the environment run gave it.
	late := exec.Command(filepath.Join(bin, "oneshot"), key, "late")
	late.Env = append(os.Environ(), "LEASEFENCE_TOKEN="+strconv.FormatInt(first, 10),
		"LEASEFENCE_RECORD="+record, "LEASEFENCE_ENDPOINTS="+eps)
	if code, out := exitCode(t, late); code != exitStale || !strings.Contains(out, "stale") {
		t.Fatalf("a late write with the first token: exit %d, want %d (stale)", code, exitStale)
	}
	g, err := cli.Get(ctx, key)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "second" {
		t.Fatalf("%s after the late write: %v %v, want the second run's value", key, g, err)
	}
}

// Outside lockctl run, or without -record, the job refuses to start.
func TestOneshotNeedsRun(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"no token", map[string]string{"LEASEFENCE_RECORD": "r", "LEASEFENCE_ENDPOINTS": "e"}, []string{"k", "v"}},
		{"no record", map[string]string{"LEASEFENCE_TOKEN": "5", "LEASEFENCE_ENDPOINTS": "e"}, []string{"k", "v"}},
		{"key is the record", map[string]string{"LEASEFENCE_TOKEN": "5", "LEASEFENCE_RECORD": "r", "LEASEFENCE_ENDPOINTS": "e"}, []string{"r", "v"}},
		{"no value", map[string]string{"LEASEFENCE_TOKEN": "5", "LEASEFENCE_RECORD": "r", "LEASEFENCE_ENDPOINTS": "e"}, []string{"k"}},
	} {
		code, err := run(c.args, func(k string) string { return c.env[k] })
		if code != exitUsage || err == nil {
			t.Errorf("%s: exit %d (%v), want %d", c.name, code, err, exitUsage)
		}
	}
}
