package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"strings"
	"testing"
	"time"
)

// usageHead is the usage text's first line.
const usageHead = "usage: lockctl [flags] COMMAND [command flags] ARGUMENTS\n"

// Help goes to stdout with status 0; a usage error goes to stderr, with
// the usage text after it, with status 2. None of these reaches etcd.
func TestUsageAndExitStatus(t *testing.T) {
	unreachable := closedPort(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		// firstErr is stderr's first line; the usage text follows it
		// when code is 2.
		firstErr string
	}{
		{"-h", []string{"-h"}, 0, ""},
		{"-help", []string{"-help"}, 0, ""},
		{"help", []string{"help"}, 0, ""},
		{"help with an argument", []string{"help", "list"}, 0, ""},
		{"-h after the flags", []string{"-json", "-h", "list", "x"}, 0, ""},
		{"a command's -h", []string{"records", "-h"}, 0, ""},
		{"no arguments", nil, 2, "lockctl: no command"},
		{"only flags", []string{"-json"}, 2, "lockctl: no command"},
		{"unknown command", []string{"frob", "x"}, 2, `lockctl: unknown command "frob"`},
		{"unknown flag", []string{"-nosuch", "list", "x"}, 2, "lockctl: flag provided but not defined: -nosuch"},
		{"global flag after the command", []string{"list", "-json", "x"}, 2, "lockctl: list: flag provided but not defined: -json"},
		{"bad duration", []string{"-timeout", "soon", "list", "x"}, 2, `lockctl: invalid value "soon" for flag -timeout: parse error`},
		{"zero timeout", []string{"-timeout", "0s", "list", "x"}, 2, "lockctl: -timeout 0s: want more than 0"},
		{"no argument", []string{"list"}, 2, "lockctl: list takes one PREFIX (its flags go before it), got 0 arguments"},
		{"two arguments", []string{"show", "a", "b"}, 2, "lockctl: show takes one NAME (its flags go before it), got 2 arguments"},
		{"a flag after the argument", []string{"records", "x", "-all"}, 2, "lockctl: records takes one PREFIX (its flags go before it), got 2 arguments"},
		{"empty argument", []string{"records", ""}, 2, "lockctl: records: empty PREFIX"},
		{"release without -token", []string{"release", "x"}, 2, "lockctl: release needs -token T, T > 0: the holder's token, as list or show print it"},
		{"release with -token 0", []string{"release", "-token", "0", "x"}, 2, "lockctl: release needs -token T, T > 0: the holder's token, as list or show print it"},
		{"run -q and -v", []string{"run", "-q", "-v", "x", "--", "true"}, 2, "lockctl: run: -q and -v together"},
		{"run's delay past the longest", []string{"run", "-ttl", "30s", "-kill-after", "40s", "x", "--", "true"}, 2,
			"lockctl: run: -ttl + -kill-after + 1s = 1m11s: want at most 1m0s, the longest lock delay"},
		{"run -lock-delay past the longest", []string{"run", "-lock-delay", "2m", "x", "--", "true"}, 2, "lockctl: run: -lock-delay 2m0s: want 0 to 1m0s"},
		{"not a usage error", []string{"-endpoints", unreachable, "-timeout", "100ms", "list", "x"}, exitUnavailable,
			"lockctl: etcd at " + unreachable + " (from -endpoints) did not answer within 100ms: context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			code := execute(ctx, tc.args, &stdout, &stderr, "alice@ops-1")
			first, rest, _ := strings.Cut(stderr.String(), "\n")
			if code != tc.code || first != tc.firstErr {
				t.Fatalf("exit %d, stderr %q; want exit %d, stderr %q", code, stderr.String(), tc.code, tc.firstErr)
			}
			switch tc.code {
			case 0:
				checkUsage(t, stdout.String())
			case 2:
				if stdout.Len() != 0 {
					t.Errorf("a usage error printed %q to stdout", stdout.String())
				}
				checkUsage(t, strings.TrimPrefix(rest, "\n"))
			default:
				if rest != "" || stdout.Len() != 0 {
					t.Errorf("a failure printed more than its error: stdout %q, stderr %q", stdout.String(), stderr.String())
				}
			}
		})
	}
}

// checkUsage checks that text is the usage text: every command with its
// arguments, every flag with its argument and its default.
func checkUsage(t *testing.T, text string) {
	t.Helper()
	if !strings.HasPrefix(text, usageHead) {
		t.Fatalf("not the usage text:\n%s", text)
	}
	lines := strings.Split(text, "\n")
	want := []string{
		"  list PREFIX ", "  show NAME ", "  records [-all] PREFIX ", "  release -token T NAME ", "  watch NAME ", "  run [flags] NAME -- COMMAND [ARGS...] ", "  put [-record KEY] [-token T] [-lock NAME] KEY VALUE ", "  help ",
		"  -endpoints URLs ", "(default $ETCD_ENDPOINTS, else 127.0.0.1:2379)",
		"  -timeout DURATION ", "(default 5s)",
		"  -token T ", "(default none: required)",
		"  -owner OWNER ", "(default host/pid)",
		"Exit status: 0 done, 1 failed, 2 bad arguments, 69 etcd did not answer;",
	}
	for _, fs := range []*flag.FlagSet{globalFlags(&config{}), commandFlags(lookup("records"), &invocation{}), commandFlags(lookup("release"), &invocation{}),
		commandFlags(lookup("run"), &invocation{}), commandFlags(lookup("put"), &invocation{})} {
		fs.VisitAll(func(f *flag.Flag) {
			if line := lineWith(lines, "  -"+f.Name+" "); line == "" {
				t.Errorf("usage: no line for flag -%s", f.Name)
			} else if !strings.HasSuffix(line, ")") || strings.Count(line, "(default ") != 1 {
				t.Errorf("usage: flag -%s without its default, or with two: %q", f.Name, line)
			}
		})
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("usage: no %q in\n%s", w, text)
		}
	}
}

// lineWith returns the first of lines that starts with prefix.
func lineWith(lines []string, prefix string) string {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// closedPort returns the URL of a loopback port nobody listens on: one
// just bound and let go.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return url
}

// With no endpoint answering, every command fails within -timeout (watch
// used to wait forever), naming the endpoints it tried and where they
// came from.
func TestUnreachableEndpoints(t *testing.T) {
	a, b := closedPort(t), closedPort(t)
	for _, tc := range []struct {
		name     string
		env, def string // ETCD_ENDPOINTS, and the default endpoints
		args     []string
		want     string
	}{
		{"flag", b, b, []string{"-endpoints", a, "list", "x"},
			"etcd at " + a + " (from -endpoints) did not answer within 200ms: context deadline exceeded"},
		{"flag, two endpoints, with a user", "", b, []string{"-endpoints", a + ", " + b, "-user", "ops:pw", "show", "x"},
			"etcd at " + a + ", " + b + " (from -endpoints) did not answer within 200ms: context deadline exceeded"},
		{"environment", a, b, []string{"records", "x"},
			"etcd at " + a + " (from ETCD_ENDPOINTS) did not answer within 200ms: context deadline exceeded"},
		{"default", "", a, []string{"watch", "x"},
			"etcd at " + a + " (default; set -endpoints or ETCD_ENDPOINTS) did not answer within 200ms: context deadline exceeded"},
		{"default, release", "", a, []string{"release", "-token", "7", "x"},
			"etcd at " + a + " (default; set -endpoints or ETCD_ENDPOINTS) did not answer within 200ms: context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envEndpoints, tc.env)
			was := defaultEndpoints
			defaultEndpoints = tc.def
			t.Cleanup(func() { defaultEndpoints = was })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var out bytes.Buffer
			start := time.Now()
			err := run(ctx, append([]string{"-timeout", "200ms"}, tc.args...), &out, "alice@ops-1")
			if err == nil || err.Error() != tc.want || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v\nwant     %s", err, tc.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("failed after %v, with -timeout 200ms", took)
			}
			if out.Len() != 0 {
				t.Errorf("printed %q", out.String())
			}
		})
	}
}

// TestUsageOfBinary: lockctl help, from the binary, is the usage text,
// each flag's default given once (run's -owner said it twice).
func TestUsageOfBinary(t *testing.T) {
	p := startLockctl(t, []string{closedPort(t)}, "help")
	if code := p.wait(t, 20*time.Second); code != 0 || p.stderr.Len() != 0 {
		t.Fatalf("lockctl help: exit %d, stderr %q", code, p.stderr.String())
	}
	checkUsage(t, p.stdout.String())
	owner := lineWith(strings.Split(p.stdout.String(), "\n"), "  -owner ")
	if !strings.HasSuffix(owner, "for lockctl show and list (default host/pid)") {
		t.Errorf("run -owner: %q", owner)
	}
}
