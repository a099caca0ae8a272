package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// TestPutFenced: put with the holder's token lands; after a newer holder
// wrote, the older token is refused with exit 3 and the value stays.
func TestPutFenced(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	record, key := name+"-record", name+"-state"
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	// Two holdings in turn, each writing the key from its command with put
	// and its token from the environment.
	for _, v := range []string{"one", "two"} {
		p := startLockctl(t, nil, "run", "-record", record, name, "--", "sh", "-c",
			`"$0" -endpoints "$LEASEFENCE_ENDPOINTS" put "$1" "$2" && echo "$LEASEFENCE_TOKEN" >> "$3"`, lockctlBin, key, v, tokens)
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("run with put %s: exit %d", v, code)
		}
	}
	toks := strings.Fields(awaitFile(t, tokens, time.Second))
	if len(toks) != 2 {
		t.Fatalf("tokens %q", toks)
	}
	// The first holding's token again, as a paused holder would send it.
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code := execute(ctx, []string{"-endpoints", strings.Join(etcd.Endpoints(), ","), "put", "-record", record, "-token", toks[0], "-lock", name, key, "stale"},
		&stdout, &stderr, "alice@ops-1")
	want := "lockctl: put " + key + ": token " + toks[0] + " is stale: record " + record + " has accepted " + toks[1] + "; " + key + " unchanged\n"
	if code != exitStale || stderr.String() != want {
		t.Fatalf("stale put: exit %d, stderr %q; want %d, %q", code, stderr.String(), exitStale, want)
	}
	resp, err := cli.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "two" {
		t.Fatalf("value after the stale put: %v %v, want two", resp, err)
	}
	hi, _ := strconv.ParseInt(toks[1], 10, 64)
	if got, err := fence.ReadRecord(context.Background(), cli, record); err != nil || got != hi {
		t.Fatalf("record after: %d %v, want %d", got, err, hi)
	}
}

// putHint is what lockctl prints after an error in put's arguments, in
// place of the usage text.
const putHint = "lockctl put -h says what put needs."

// TestPutArguments: an error in put's arguments prints that error and a
// one-line hint, not the whole usage text, with status 2.
func TestPutArguments(t *testing.T) {
	t.Setenv("LEASEFENCE_TOKEN", "")
	t.Setenv("LEASEFENCE_RECORD", "")
	t.Setenv("LEASEFENCE_LOCK", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"put", "k", "v"}, "lockctl: put needs -record KEY, or LEASEFENCE_RECORD (lockctl run -record sets it)"},
		{[]string{"put", "-record", "r", "k", "v"}, "lockctl: put needs -token T, or LEASEFENCE_TOKEN (lockctl run sets it)"},
		{[]string{"put", "-record", "r", "-token", "x", "k", "v"}, `lockctl: put: token "x": want a whole number above 0`},
		{[]string{"put", "-record", "k", "-token", "3", "k", "v"}, `lockctl: put: KEY "k" is the fence record itself`},
		{[]string{"put", "-record", "r", "-token", "3", "k"}, "lockctl: put takes KEY VALUE (its flags go before KEY), got 1 arguments"},
		{[]string{"put", "-record", "r", "-token", "3", "k", "v"}, "lockctl: put needs -lock NAME, or LEASEFENCE_LOCK (lockctl run sets it), to have etcd confirm the token; -unverified skips that"},
		{[]string{"put", "-record", "r", "-token", "3", "-lock", "n", "-unverified", "k", "v"}, "lockctl: put: -lock and -unverified together: give one"},
	} {
		var stdout, stderr bytes.Buffer
		code := execute(context.Background(), tc.args, &stdout, &stderr, "alice@ops-1")
		if want := tc.want + "\n" + putHint + "\n"; code != exitUsage || stderr.String() != want || stdout.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want %d, %q", tc.args, code, stderr.String(), stdout.String(), exitUsage, want)
		}
	}
	// The binary, as the on-call user ran it: no record anywhere.
	p := startLockctl(t, nil, "put", "k", "v")
	want := "lockctl: put needs -record KEY, or LEASEFENCE_RECORD (lockctl run -record sets it)\n" + putHint + "\n"
	if code := p.wait(t, 20*time.Second); code != exitUsage || p.stderr.String() != want || p.stdout.Len() != 0 {
		t.Fatalf("lockctl put k v: exit %d, stderr %q, stdout %q; want %d, %q", code, p.stderr.String(), p.stdout.String(), exitUsage, want)
	}
}

// TestRunSignalWhileWaiting: a signal to a waiting lockctl ends the wait
// with 128 + its number, and the command does not run.
func TestRunSignalWhileWaiting(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	s := session(t, cli)
	if _, err := s.Lock(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	p := startLockctl(t, nil, "run", name, "--", "touch", marker)
	awaitQueue(t, cli, name, 2)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != exitSignal+int(syscall.SIGINT) {
		t.Fatalf("exit %d, want %d", code, exitSignal+int(syscall.SIGINT))
	}
	awaitQueue(t, cli, name, 1)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
}

// TestPutVerifiesToken: put confirms a token above the record's with etcd
// before it raises the record. A number no holding has (far above etcd's
// revision, or a revision that created no key of the lock) exits 5 and
// changes nothing; the holder's own token then still writes. A token at or
// below the record's is decided by the guarded write, as before.
func TestPutVerifiesToken(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	record, key := name+"-record", name+"-state"
	s := session(t, cli)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	l, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	put := func(token int64, value string, extra ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		args := append([]string{"-endpoints", strings.Join(etcd.Endpoints(), ","), "put", "-record", record,
			"-token", strconv.FormatInt(token, 10)}, extra...)
		code := execute(ctx, append(args, key, value), &stdout, &stderr, "alice@ops-1")
		return code, stderr.String()
	}
	other, err := cli.Put(ctx, name+"-elsewhere", "x") // a revision that created no key of the lock
	if err != nil {
		t.Fatal(err)
	}
	for _, forged := range []int64{9000000000000000000, other.Header.Revision} {
		code, stderr := put(forged, "forged", "-lock", name)
		if code != exitUnverified || !strings.Contains(stderr, "unverified token") || !strings.Contains(stderr, key+" unchanged") {
			t.Fatalf("forged token %d: exit %d, stderr %q; want %d", forged, code, stderr, exitUnverified)
		}
		if got, err := fence.ReadRecord(ctx, cli, record); err != nil || got != 0 {
			t.Fatalf("record after forged token %d: %d %v, want none", forged, got, err)
		}
	}
	if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("key after forged puts: %v %v", resp, err)
	}
	// Another lock's real token is no holding of this one.
	l2, err := s.Lock(ctx, name+"-other")
	if err != nil {
		t.Fatal(err)
	}
	if code, stderr := put(l2.Token(), "misdirected", "-lock", name); code != exitUnverified {
		t.Fatalf("another lock's token: exit %d, stderr %q", code, stderr)
	}
	if code, stderr := put(l.Token(), "mine", "-lock", name); code != 0 {
		t.Fatalf("holder's put: exit %d, stderr %q", code, stderr)
	}
	// -unverified opts out: the check is what refused the forged token.
	if code, stderr := put(l.Token()+1000000, "unchecked", "-unverified"); code != 0 {
		t.Fatalf("-unverified put: exit %d, stderr %q", code, stderr)
	}
	// Now below the record, the holder's token is decided by the guarded
	// write as before: stale, exit 3, not 5.
	if code, stderr := put(l.Token(), "late", "-lock", name); code != exitStale {
		t.Fatalf("stale put: exit %d, stderr %q; want %d", code, stderr, exitStale)
	}
}
