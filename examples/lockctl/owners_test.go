package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// table is a text table as lockctl prints it.
type table struct {
	header []string
	rows   []map[string]string // header -> cell
}

// headerCell is one cell of a header: words one space apart; cells are at
// least two spaces apart.
var headerCell = regexp.MustCompile(`\S+( \S+)*`)

// parseTable reads lines as a table: each column starts where its header
// does, so a cell may hold single spaces.
func parseTable(t *testing.T, lines []string) table {
	t.Helper()
	if len(lines) == 0 {
		t.Fatal("no table")
	}
	locs := headerCell.FindAllStringIndex(lines[0], -1)
	var tb table
	for _, loc := range locs {
		tb.header = append(tb.header, lines[0][loc[0]:loc[1]])
	}
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, loc := range locs {
			end := len(line)
			if i+1 < len(locs) {
				end = min(locs[i+1][0], len(line))
			}
			row[tb.header[i]] = strings.TrimSpace(line[min(loc[0], end):end])
		}
		tb.rows = append(tb.rows, row)
	}
	return tb
}

// column maps each row's cell in column key to its cell in column col.
func (tb table) column(key, col string) map[string]string {
	m := map[string]string{}
	for _, r := range tb.rows {
		m[r[key]] = r[col]
	}
	return m
}

// ownedLocks are locks held by sessions that recorded their owners, and
// one by etcd's own Mutex, which records none.
type ownedLocks struct {
	pfx                         string
	job, leader, manifest, mutx string
	jobToken                    int64
	jobLease                    clientv3.LeaseID
}

// holdOwnedLocks takes the locks of ownedLocks: job held by "worker-a"
// with "worker b" waiting, leader won by "scheduler-1" with a value,
// manifest read-locked by "reader-1", mutx by an etcd Mutex. Everything
// ends with the test.
func holdOwnedLocks(ctx context.Context, t *testing.T, cli *clientv3.Client) ownedLocks {
	t.Helper()
	pfx := etcdproc.Name(t, "owners")
	o := ownedLocks{pfx: pfx, job: pfx + "/jobs/7", leader: pfx + "/leader", manifest: pfx + "/manifest", mutx: pfx + "/etcd-mutex"}
	hs := session(t, cli, lease.WithOwner("worker-a"))
	holder, err := hs.Lock(ctx, o.job)
	if err != nil {
		t.Fatal(err)
	}
	o.jobToken, o.jobLease = holder.Token(), hs.Lease()
	waiter := session(t, cli, lease.WithOwner("worker b"))
	waiterCtx, stopWaiter := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		_, _ = waiter.Lock(waiterCtx, o.job) // it waits until the test ends
	}()
	t.Cleanup(func() { stopWaiter(); <-waited })
	if _, err := session(t, cli, lease.WithOwner("scheduler-1")).Campaign(ctx, o.leader, "10.0.0.7:8080"); err != nil {
		t.Fatal(err)
	}
	if _, err := session(t, cli, lease.WithOwner("reader-1")).RLock(ctx, o.manifest); err != nil {
		t.Fatal(err)
	}
	es, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es.Close() })
	if err := concurrency.NewMutex(es, o.mutx).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waitEntries(ctx, t, cli, o.job, 2) // the waiter queues
	return o
}

// The owner each session recorded shows in list and show, in a column of
// its own; the value column shows only where some entry has a value.
func TestOwnersInTables(t *testing.T) {
	etcdproc.LeakCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := holdOwnedLocks(ctx, t, etcd.Client(t))
	listHeader := []string{"NAME", "MODE", "HOLDERS", "TOKEN", "LEASE", "TTL", "WAITERS", "HOLDER KEY", "OWNER"}
	showHeader := []string{"POS", "MODE", "TOKEN", "LEASE", "TTL", "KEY", "OWNER"}
	for _, tc := range []struct {
		args   []string
		header []string
		key    string            // the column that names a row
		owners map[string]string // key -> OWNER
		values map[string]string // key -> VALUE; nil: no VALUE column
	}{
		{[]string{"list", o.pfx}, slices.Concat(listHeader, []string{"VALUE"}), "NAME",
			map[string]string{o.job: "worker-a", o.leader: "scheduler-1", o.manifest: "reader-1", o.mutx: "-"},
			map[string]string{o.job: `""`, o.leader: `"10.0.0.7:8080"`, o.manifest: `""`, o.mutx: `""`}},
		{[]string{"list", o.pfx + "/jobs"}, listHeader, "NAME", map[string]string{o.job: "worker-a"}, nil},
		{[]string{"show", o.job}, showHeader, "POS", map[string]string{"holder": "worker-a", "1": "worker b"}, nil},
		{[]string{"show", o.leader}, slices.Concat(showHeader, []string{"VALUE"}), "POS",
			map[string]string{"holder": "scheduler-1"}, map[string]string{"holder": `"10.0.0.7:8080"`}},
		{[]string{"show", o.manifest}, showHeader, "POS", map[string]string{"holder": "reader-1"}, nil},
		{[]string{"show", o.mutx}, showHeader, "POS", map[string]string{"holder": "-"}, nil},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), o.pfx, "PFX"), func(t *testing.T) {
			out, err := lockctl(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			tb := parseTable(t, strings.Split(strings.TrimSpace(out), "\n"))
			if !slices.Equal(tb.header, tc.header) {
				t.Fatalf("header %q, want %q", tb.header, tc.header)
			}
			if got := tb.column(tc.key, "OWNER"); !maps.Equal(got, tc.owners) {
				t.Errorf("owners %q, want %q", got, tc.owners)
			}
			if got := tb.column(tc.key, "VALUE"); tc.values != nil && !maps.Equal(got, tc.values) {
				t.Errorf("values %q, want %q", got, tc.values)
			}
		})
	}
}

// JSON output has every entry's "owner", empty where none was recorded.
func TestOwnersInJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := holdOwnedLocks(ctx, t, etcd.Client(t))
	for _, tc := range []struct {
		args []string
		want []string // the owners, in order: list's holders, show's queue
	}{
		{[]string{"-json", "list", o.pfx}, []string{"", "worker-a", "scheduler-1", "reader-1"}}, // by name: etcd-mutex first
		{[]string{"-json", "show", o.job}, []string{"worker-a", "worker b"}},
		{[]string{"-json", "show", o.mutx}, []string{""}},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), o.pfx, "PFX"), func(t *testing.T) {
			out, err := lockctl(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := jsonOwners(t, tc.args[1], out); !slices.Equal(got, tc.want) {
				t.Errorf("owners %q, want %q", got, tc.want)
			}
		})
	}
}

// jsonOwners reads the "owner" of each entry in cmd's JSON output; an
// entry without one fails the test.
func jsonOwners(t *testing.T, cmd, out string) []string {
	t.Helper()
	var entries []map[string]any
	if cmd == "list" {
		var locks []struct {
			Holder map[string]any `json:"holder"`
		}
		if err := json.Unmarshal([]byte(out), &locks); err != nil {
			t.Fatal(err)
		}
		for _, l := range locks {
			entries = append(entries, l.Holder)
		}
	} else if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, e := range entries {
		owner, ok := e["owner"].(string)
		if !ok {
			t.Fatalf("an entry with no owner: %v", e)
		}
		owners = append(owners, owner)
	}
	return owners
}

// watch prints each new holder's owner, text and JSON.
func TestOwnersInWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := holdOwnedLocks(ctx, t, etcd.Client(t))
	for _, tc := range []struct {
		args []string
		want string // how the first line ends
	}{
		{[]string{"watch", o.job}, fmt.Sprintf("  token %d  lease %x  owner worker-a\n", o.jobToken, int64(o.jobLease))},
		{[]string{"watch", o.leader}, `  owner scheduler-1  value "10.0.0.7:8080"` + "\n"},
		{[]string{"watch", o.mutx}, "  owner -\n"},
		{[]string{"-json", "watch", o.job}, fmt.Sprintf(`,"token":%d,"lease":"%x","owner":"worker-a"}`+"\n", o.jobToken, int64(o.jobLease))},
		{[]string{"-json", "watch", o.leader}, `,"owner":"scheduler-1","value":"10.0.0.7:8080"}` + "\n"},
		{[]string{"-json", "watch", o.mutx}, `,"owner":""}` + "\n"},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), o.pfx, "PFX"), func(t *testing.T) {
			if first := watchFirst(t, tc.args...); !strings.HasSuffix(first, tc.want) {
				t.Errorf("watch printed %q, want it to end with %q", first, tc.want)
			}
		})
	}
}

// watchFirst runs lockctl watch until it prints its first line, the
// current holder, and returns that line.
func watchFirst(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-endpoints", strings.Join(etcd.Endpoints(), ",")}, args...), &out, "alice@ops-1")
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watch: %v", err)
		}
	}()
	waitLines(t, &out, 1)
	first, _, _ := strings.Cut(out.String(), "\n")
	return first + "\n"
}

// fenceKeys are keys under one prefix: fence records and keys that are
// not.
type fenceKeys struct {
	pfx     string
	records map[string]string // key -> highest token
	skipped map[string]string // key -> why records skips it
}

// putFenceKeys writes two fence records, a lock key, a key on a lease
// whose value is a token, and two values that are not tokens.
func putFenceKeys(ctx context.Context, t *testing.T, cli *clientv3.Client) fenceKeys {
	t.Helper()
	pfx := etcdproc.Name(t, "records")
	l, err := session(t, cli).Lock(ctx, pfx+"/locks/x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(ctx, cli, fence.Resource(pfx+"/fences/a", l.Token())).Then(clientv3.OpPut(pfx+"/data", "offset 42")).Commit(); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []struct {
		key, value string
		lease      clientv3.LeaseID
	}{
		{pfx + "/fences/b", fence.EncodeToken(7), 0},
		{pfx + "/leased", fence.EncodeToken(9), g.ID},               // a token, but on a lease
		{pfx + "/upper", strings.ToUpper(fence.EncodeToken(42)), 0}, // hex, but not canonical
	} {
		if _, err := cli.Put(ctx, kv.key, kv.value, clientv3.WithLease(kv.lease)); err != nil {
			t.Fatal(err)
		}
	}
	return fenceKeys{pfx: pfx,
		records: map[string]string{pfx + "/fences/a": fmt.Sprint(l.Token()), pfx + "/fences/b": "7"},
		skipped: map[string]string{pfx + "/data": skipNotToken, pfx + "/leased": skipLeased, l.Key(): skipLeased, pfx + "/upper": skipNotToken},
	}
}

// records lists fence records only; other keys are counted, or listed
// with -all. A key on a lease is never a record, whatever its value.
func TestRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := putFenceKeys(ctx, t, etcd.Client(t))
	for _, tc := range []struct {
		args    []string
		summary string            // the line after the table; "" for none
		skipped map[string]string // the -all table; nil for none
	}{
		{[]string{"records", k.pfx}, "(4 other keys skipped: 2 on a lease, 2 not a fence token; records -all lists them)", nil},
		{[]string{"records", "-all", k.pfx}, "", k.skipped},
		{[]string{"records", k.pfx + "/fences/"}, "", nil},
		{[]string{"records", k.pfx + "/locks/"}, "(1 other key skipped: 1 on a lease; records -all lists them)", nil},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), k.pfx, "PFX"), func(t *testing.T) {
			out, err := lockctl(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			blocks := strings.Split(strings.TrimSpace(out), "\n\n")
			lines := strings.Split(blocks[0], "\n")
			summary := ""
			if last := lines[len(lines)-1]; strings.HasPrefix(last, "(") {
				lines, summary = lines[:len(lines)-1], last
			}
			if summary != tc.summary {
				t.Errorf("summary %q, want %q", summary, tc.summary)
			}
			if got, want := parseTable(t, lines).column("KEY", "HIGHEST TOKEN"), under(k.records, tc.args[len(tc.args)-1]); !maps.Equal(got, want) {
				t.Errorf("records %q, want %q", got, want)
			}
			var skipped map[string]string
			if len(blocks) > 1 {
				skipped = parseTable(t, strings.Split(blocks[1], "\n")).column("SKIPPED KEY", "WHY")
			}
			if len(blocks) > 2 || !maps.Equal(skipped, tc.skipped) || (skipped == nil) != (tc.skipped == nil) {
				t.Errorf("skipped %q, want %q, in\n%s", skipped, tc.skipped, out)
			}
		})
	}
}

// records -json lists the records, and with -all the keys skipped, each
// with why.
func TestRecordsJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := putFenceKeys(ctx, t, etcd.Client(t))
	for _, tc := range []struct {
		args []string
		want map[string]string // key -> highest, or why skipped
	}{
		{[]string{"-json", "records", k.pfx}, k.records},
		{[]string{"-json", "records", "-all", k.pfx}, merge(k.records, k.skipped)},
		{[]string{"-json", "records", k.pfx + "/nothing/"}, map[string]string{}},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), k.pfx, "PFX"), func(t *testing.T) {
			out, err := lockctl(t, tc.args...)
			var infos []recordInfo
			if err != nil || json.Unmarshal([]byte(out), &infos) != nil {
				t.Fatalf("%v %q", err, out)
			}
			got := map[string]string{}
			for _, ri := range infos {
				got[ri.Key] = ri.Skipped
				if ri.Highest != nil {
					got[ri.Key] += fmt.Sprint(*ri.Highest)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// under keeps the entries of m whose keys start with prefix.
func under(m map[string]string, prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}

func merge(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}
