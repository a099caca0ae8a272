package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

var etcd etcdproc.Env

// lockedBuffer is a bytes.Buffer that watch may write while the test
// reads, and that tells the test of each write.
type lockedBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed by the next Write
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	s, _ := l.next()
	return s
}

// next returns what was written so far, and a channel closed by the next
// write.
func (l *lockedBuffer) next() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.b.String(), l.changed
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper(os.Getenv(helperEnv), os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "lockctl-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := buildLockctl(dir)
	if code == 0 {
		code = etcd.Main(m, etcdproc.Config{})
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// lockctl runs the command in-process against the test's etcd and returns
// its output.
func lockctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all := append([]string{"-endpoints", strings.Join(etcd.Endpoints(), ",")}, args...)
	err := run(ctx, all, &out, "alice@ops-1")
	t.Logf("$ lockctl %s\n%s", strings.Join(args, " "), out.String())
	return out.String(), err
}

func session(t *testing.T, cli *clientv3.Client, opts ...lease.Option) *lease.Session {
	t.Helper()
	s, err := lease.NewSession(context.Background(), cli, append([]lease.Option{lease.WithTTL(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// opsState is what TestLockctl sets up: a lock held by holder with
// waiter queued behind it, an election won with a value, a data key that
// is not a lock, and a fence record of holder's token.
type opsState struct {
	pfx, shard, sched string
	holder            *lease.Lock
	waiter            *lease.Session
	granted           chan grant // the waiter's Lock, once it returns
}

// grant is what a Lock call returned.
type grant struct {
	l   *lease.Lock
	err error
}

func TestLockctl(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := setUpOps(ctx, t, cli)
	checkList(t, o)
	checkShowRecords(t, o)
	checkReleaseRefused(t, o)
	lines := watchRelease(ctx, t, o)
	var first, second handoff
	if json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[1]), &second) != nil ||
		first.Token != o.holder.Token() || second.Token <= first.Token || second.Lease != fmt.Sprintf("%x", int64(o.waiter.Lease())) {
		t.Fatalf("watch lines %q", lines)
	}
	g := <-o.granted // the waiter's Lock returns once it has read its grant
	if g.err != nil {
		t.Fatalf("the waiter: %v", g.err)
	}
	if err := g.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// setUpOps sets up TestLockctl's opsState; the waiter's Lock ends with
// ctx at the latest.
func setUpOps(ctx context.Context, t *testing.T, cli *clientv3.Client) opsState {
	t.Helper()
	pfx := etcdproc.Name(t, "ops")
	o := opsState{pfx: pfx, shard: pfx + "/shards/7", sched: pfx + "/scheduler", granted: make(chan grant, 1)}
	var err error
	if o.holder, err = session(t, cli).Lock(ctx, o.shard); err != nil {
		t.Fatal(err)
	}
	o.waiter = session(t, cli)
	go func() {
		l, err := o.waiter.Lock(ctx, o.shard)
		o.granted <- grant{l, err}
	}()
	if _, err := session(t, cli).Campaign(ctx, o.sched, "10.0.0.7:8080"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, o.shard+"/checkpoint", "offset 42"); err != nil { // data, not a lock
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(ctx, cli, fence.Resource(pfx+"/fences/shard-7", o.holder.Token())).Then(clientv3.OpPut(pfx+"/data", "x")).Commit(); err != nil {
		t.Fatal(err)
	}
	waitEntries(ctx, t, cli, o.shard, 2) // the waiter queues
	return o
}

// checkList checks what list prints of o, as a table and as JSON.
func checkList(t *testing.T, o opsState) {
	t.Helper()
	out, err := lockctl(t, "list", o.pfx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{o.shard, o.sched, fmt.Sprint(o.holder.Token()), o.holder.Key(), `"10.0.0.7:8080"`} {
		if !strings.Contains(out, want) {
			t.Errorf("list: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "checkpoint") {
		t.Errorf("list shows a data key as a lock:\n%s", out)
	}
	out, err = lockctl(t, "-json", "list", o.pfx)
	var locks []lockInfo
	if err != nil || json.Unmarshal([]byte(out), &locks) != nil || len(locks) != 2 {
		t.Fatalf("list -json: %v %q", err, out)
	}
	for _, l := range locks {
		if l.Name == o.shard && (l.Waiters != 1 || l.Holder.Token != o.holder.Token() || l.Holder.TTLSeconds <= 0) {
			t.Errorf("list -json for %s: %+v", o.shard, l)
		}
	}
}

// checkShowRecords checks what show and records print of o.
func checkShowRecords(t *testing.T, o opsState) {
	t.Helper()
	out, err := lockctl(t, "show", o.shard)
	if err != nil || !strings.Contains(out, "holder") || strings.Count(out, o.pfx) != 2 {
		t.Fatalf("show: %v\n%s", err, out)
	}
	out, err = lockctl(t, "records", o.pfx+"/fences/")
	if err != nil || !strings.Contains(out, fmt.Sprint(o.holder.Token())) {
		t.Fatalf("records: %v\n%s", err, out)
	}
}

// checkReleaseRefused checks that release refuses a wrong token, and no
// token, and deletes nothing.
func checkReleaseRefused(t *testing.T, o opsState) {
	t.Helper()
	if _, err := lockctl(t, "release", "-token", fmt.Sprint(o.holder.Token()+1000), o.shard); err == nil || !strings.Contains(err.Error(), "not the holder's") {
		t.Fatalf("release with a wrong token: %v", err)
	}
	if o.holder.Err() != nil {
		t.Fatalf("a refused release ended the lock: %v", o.holder.Err())
	}
	if _, err := lockctl(t, "release", o.shard); err == nil {
		t.Fatal("release without -token ran")
	}
}

// watchRelease releases o's holder with its token while lockctl -json
// watch runs, checks the release, and returns watch's lines: the holder,
// then its successor.
func watchRelease(ctx context.Context, t *testing.T, o opsState) []string {
	t.Helper()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watchOut lockedBuffer
	watched := make(chan error, 1)
	go func() {
		watched <- run(watchCtx, []string{"-endpoints", strings.Join(etcd.Endpoints(), ","), "-json", "watch", o.shard}, &watchOut, "alice@ops-1")
	}()
	waitLines(t, &watchOut, 1) // watch has shown the current holder
	out, err := lockctl(t, "release", "-token", fmt.Sprint(o.holder.Token()), o.shard)
	if err != nil || !strings.HasPrefix(out, "audit: ") || !strings.Contains(out, "operator=alice@ops-1") || !strings.Contains(out, o.holder.Key()) {
		t.Fatalf("release: %v\n%s", err, out)
	}
	<-o.holder.Done()
	if !errors.Is(o.holder.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("released holder ended with %v", o.holder.Err())
	}
	waitLines(t, &watchOut, 2) // and the handoff
	stopWatch()
	if err := <-watched; err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Logf("$ lockctl -json watch %s\n%s", o.shard, watchOut.String())
	return strings.Split(strings.TrimSpace(watchOut.String()), "\n")
}

// waitLines waits until out has n lines, for at most 10 s.
func waitLines(t *testing.T, out *lockedBuffer, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		s, changed := out.next()
		if strings.Count(s, "\n") >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("watch printed %q, want %d lines", s, n)
		}
	}
}

// lockctl speaks TLS with client certificates and etcd's authentication,
// with etcdctl's flags.
func TestLockctlTLSAndAuth(t *testing.T) {
	etcdproc.LeakCheck(t)
	certs, err := etcdproc.GenerateCerts(t.TempDir(), "root", "ops")
	if err != nil {
		t.Fatal(err)
	}
	c := etcdproc.StartTLST(t, certs)
	eps := strings.Join(c.Endpoints(), ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Set up a user with read-write on "ops/" and switch auth on, as root.
	rootTLS, err := certs.Clients["root"].ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: rootTLS, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, step := range []func() error{
		func() error { _, err := root.RoleAdd(ctx, "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "ops"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "ops", "ops/", clientv3.GetPrefixRangeEnd("ops/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "ops", "ops-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "ops", "ops"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	opsTLS := certs.Clients["ops"]
	tlsArgs := []string{"-endpoints", eps, "-cacert", certs.CAFile, "-cert", opsTLS.CertFile, "-key", opsTLS.KeyFile}
	var out bytes.Buffer
	if err := run(ctx, append(tlsArgs, "-user", "ops:ops-pw", "list", "ops/"), &out, "alice@ops-1"); err != nil {
		t.Fatalf("list over TLS as ops: %v", err)
	}
	if out.String() != "no locks held under ops/\n" {
		t.Fatalf("list printed %q", out.String())
	}
	out.Reset()
	err = run(ctx, append(tlsArgs, "-user", "ops", "-password", "wrong", "list", "ops/"), &out, "alice@ops-1")
	if err == nil {
		t.Fatal("a wrong password was accepted")
	}
	t.Logf("wrong password: %v", err)
}

// waitEntries waits until Inspect finds n entries under name, looking
// again at each change under the name.
func waitEntries(ctx context.Context, t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for {
		if e, err := lease.Inspect(ctx, cli, name); err == nil && len(e) >= n {
			return
		}
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("%d entries never queued under %s", n, name)
		}
	}
}

// Readers share a lock: show and list count them all as holders, with
// their mode, and release takes any one of them by its token.
func TestLockctlReaders(t *testing.T) {
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := etcdproc.Name(t, "manifest")
	r1, err := session(t, cli).RLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := session(t, cli).RLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	writer := make(chan error, 1)
	ws := session(t, cli) // here: t.Fatal ends only the test's own goroutine
	go func() {
		l, err := ws.Lock(ctx, name)
		if err == nil {
			err = l.Unlock(ctx)
		}
		writer <- err
	}()
	waitEntries(ctx, t, cli, name, 3) // the writer queues
	checkReadersShown(t, name)
	if _, err := lockctl(t, "release", "-token", fmt.Sprint(r2.Token()), name); err != nil {
		t.Fatalf("release of the second reader: %v", err)
	}
	select {
	case <-r2.Done():
	case <-ctx.Done():
		t.Fatal("the released reader's holding did not end")
	}
	if r1.Err() != nil {
		t.Fatalf("releasing one reader ended the other: %v", r1.Err())
	}
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-writer; err != nil {
		t.Fatalf("writer after the readers: %v", err)
	}
}

// checkReadersShown checks that show and list -json count the two readers
// holding name as holders, and the writer as waiting.
func checkReadersShown(t *testing.T, name string) {
	t.Helper()
	out, err := lockctl(t, "show", name)
	var rows []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		f := strings.Fields(line)
		rows = append(rows, f[0]+" "+f[1])
	}
	if err != nil || strings.Join(rows, ", ") != "holder read, holder read, 1 write" {
		t.Fatalf("show with two readers and a waiting writer: %v, rows %q\n%s", err, rows, out)
	}
	out, err = lockctl(t, "-json", "list", name)
	var locks []lockInfo
	if err != nil || json.Unmarshal([]byte(out), &locks) != nil || len(locks) != 1 ||
		locks[0].Holders != 2 || locks[0].Waiters != 1 || locks[0].Holder.Mode != "read" {
		t.Fatalf("list -json: %v %q", err, out)
	}
}

// A holder's key moved off its lease by someone else's put is no lock:
// show leaves it out of the queue, names it in a note that says etcd's own
// lock code still waits behind it, and shows the waiter as the holder.
func TestShowKeyMovedOffLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := etcdproc.Name(t, "stray")
	holder, err := session(t, cli).Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, holder.Key(), "moved"); err != nil {
		t.Fatal(err)
	}
	<-holder.Done()
	l, err := session(t, cli).Lock(ctx, name)
	if err != nil {
		t.Fatalf("the next lock, behind a key moved off its lease: %v", err)
	}
	defer l.Unlock(ctx)
	out, err := lockctl(t, "show", name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "holder") || !strings.Contains(lines[1], l.Key()) ||
		!strings.HasPrefix(lines[2], "note: "+holder.Key()) || !strings.Contains(lines[2], "etcd's own lock code waits behind it") {
		t.Fatalf("show with a key moved off its lease:\n%s", out)
	}
}

// TestListNoLocks: list under a prefix with no locks says so, rather
// than printing a bare header; -json prints an empty array.
func TestListNoLocks(t *testing.T) {
	pfx := etcdproc.Name(t, "none")
	if _, err := etcd.Client(t).Put(context.Background(), pfx+"/data", "not a lock"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", pfx}, "no locks held under " + pfx + "\n"},
		{[]string{"-json", "list", pfx}, "[]\n"},
	} {
		p := startLockctl(t, nil, tc.args...)
		if code := p.wait(t, 20*time.Second); code != 0 || p.stdout.String() != tc.want || p.stderr.Len() != 0 {
			t.Errorf("lockctl %v: exit %d, stdout %q, stderr %q; want 0, %q", tc.args, code, p.stdout.String(), p.stderr.String(), tc.want)
		}
	}
}

// TestReleaseOperatorWithoutUSER: with $USER unset (su, cron, a
// container), release's audit line names the operator by the account of
// its uid, not by a bare number.
func TestReleaseOperatorWithoutUSER(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "job")
	l, err := session(t, cli).Lock(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	p := newLockctl(nil, "release", "-token", fmt.Sprint(l.Token()), name)
	p.cmd.Env = slices.DeleteFunc(p.cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "USER=") })
	p.start(t)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("release: exit %d", code)
	}
	host, _ := os.Hostname()
	who := "uid:" + strconv.Itoa(os.Getuid())
	if u, err := user.LookupId(strconv.Itoa(os.Getuid())); err == nil && u.Username != "" {
		who = u.Username
	}
	if want := " operator=" + who + "@" + host + " "; !strings.Contains(p.stdout.String(), want) {
		t.Fatalf("audit line %q, want it to name%s", p.stdout.String(), want)
	}
}

// TestOperatorName: the operator is $USER, else the uid's account, else
// the uid itself, marked as one.
func TestOperatorName(t *testing.T) {
	found := func(string) (*user.User, error) { return &user.User{Username: "ops"}, nil }
	missing := func(id string) (*user.User, error) { return nil, user.UnknownUserIdError(1000) }
	for _, tc := range []struct {
		env    string
		lookup func(string) (*user.User, error)
		want   string
	}{
		{"alice", found, "alice"},
		{"", found, "ops"},
		{"", missing, "uid:1000"},
	} {
		if got := operatorName(tc.env, 1000, tc.lookup); got != tc.want {
			t.Errorf("operatorName(%q, 1000): %q, want %q", tc.env, got, tc.want)
		}
	}
}
