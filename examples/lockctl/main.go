// Command lockctl shows and manages the locks of package lease (and of
// etcd's own concurrency package, which uses the same keys) for the people
// who run a cluster with them.
//
//	lockctl [flags] list PREFIX               locks under PREFIX: holder, its owner, waiter count
//	lockctl [flags] show NAME                 the whole queue of lock NAME, with each entry's owner
//	lockctl [flags] records [-all] PREFIX     fence records under PREFIX, decoded
//	lockctl [flags] release -token T NAME     delete the holder's key, only if its token is T
//	lockctl [flags] watch NAME                print each handoff until interrupted
//	lockctl [flags] run [flags] NAME -- CMD   hold NAME while CMD runs; stop CMD if it is lost
//	lockctl [flags] put KEY VALUE             write KEY guarded by a fence record and a token
//	lockctl help                              the usage text, with every flag and its default
//
// Flags: -endpoints (default $ETCD_ENDPOINTS, else 127.0.0.1:2379), etcd's
// -cacert, -cert, -key, -user (name or name:password) and -password, -json
// for output a script reads, and -timeout, how long etcd has to answer
// the connection and each request. lockctl waits for an endpoint to
// answer before it runs a command, and if none does, says which
// endpoints it tried and where it found them.
//
// An owner is what a session recorded with lease.WithOwner (by default
// its host name and process ID); "-" when it recorded none, as etcd's own
// lock code does not. records lists only fence records: keys on a lease
// (lock keys, owner records) and values that are not tokens are counted,
// and listed with -all.
//
// release never deletes blindly: it reads the queue, refuses unless the
// current holder's token is T, and deletes that key in a transaction
// guarded by its creation revision, so a lock that changed hands meanwhile
// is left alone. It prints one audit line: who, what, when. The lost
// holder's own fenced writes are refused from then on.
//
// run and put are for shell jobs: lockctl run -h tells what run promises,
// the environment its command gets and its exit statuses.
//
// Exit status: 0 done (help included), 1 failed, 2 bad arguments, with
// the usage text on stderr, 69 etcd did not answer; run and put have more.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

func main() {
	// run forwards these to its child; the other commands stop on them.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	code := executeWith(context.Background(), os.Args[1:], os.Stdout, os.Stderr, whoAmI(), sigs)
	signal.Stop(sigs)
	os.Exit(code)
}

// execute runs lockctl with args and returns its exit status (exit.go).
func execute(ctx context.Context, args []string, stdout, stderr io.Writer, who string) int {
	return executeWith(ctx, args, stdout, stderr, who, nil)
}

// executeWith is execute with the signals lockctl receives: run forwards
// them to its child, the other commands stop at the first.
func executeWith(ctx context.Context, args []string, stdout, stderr io.Writer, who string, sigs <-chan os.Signal) int {
	err := runWith(ctx, args, stdout, who, sigs)
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue) && ue.hint != "":
		fmt.Fprintf(stderr, "lockctl: %v\n%s\n", err, ue.hint)
		return exitUsage
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "lockctl: %v\n\n", err)
		writeUsage(stderr)
		return exitUsage
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(stderr, "lockctl:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "lockctl:", err)
	return exitFailed
}

// run parses args and runs one command, writing to out (the usage text
// too, when asked for). who names the operator in release's audit line.
func run(ctx context.Context, args []string, out io.Writer, who string) error {
	return runWith(ctx, args, out, who, nil)
}

// runWith is run with the signals lockctl receives (nil for none).
func runWith(ctx context.Context, args []string, out io.Writer, who string, sigs <-chan os.Signal) error {
	inv, err := parseArgs(args)
	if err != nil {
		return err
	}
	if inv.help {
		writeUsage(out)
		if inv.cmd != nil && inv.cmd.help != nil {
			inv.cmd.help(out)
		}
		return nil
	}
	if inv.cmd.name != "run" {
		var stop context.CancelFunc
		ctx, stop = stopOnSignal(ctx, sigs)
		defer stop()
	}
	cli, err := connect(ctx, inv.cfg)
	if err != nil {
		if unanswered(err) {
			return exitWith(exitUnavailable, err)
		}
		return err
	}
	defer cli.Close()
	return inv.cmd.run(ctx, &ctl{cli: cli, cfg: inv.cfg, out: out, who: who, sigs: sigs}, inv)
}

// stopOnSignal is ctx, ended by the first of sigs.
func stopOnSignal(ctx context.Context, sigs <-chan os.Signal) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if sigs == nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); <-done }
}

// ctl runs the commands.
type ctl struct {
	cli *clientv3.Client
	cfg config
	out io.Writer
	who string // the operator, for release's audit line
	// sigs are the signals lockctl receives, which run forwards to its
	// child; nil in tests that run lockctl in-process.
	sigs <-chan os.Signal
}

func (c *ctl) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.cfg.timeout)
}

// entry is one place in a queue, in JSON output.
type entry struct {
	Key        string  `json:"key"`
	Token      int64   `json:"token"`
	Lease      string  `json:"lease"`
	TTLSeconds float64 `json:"ttl_seconds"`
	Owner      string  `json:"owner"` // empty if its session recorded none
	Value      string  `json:"value"`
	Mode       string  `json:"mode"`
	// For a holder that waits out a lock delay (it holds the lock, but a
	// lockctl run has not started its command): the lost token, and
	// about how long is left.
	DelayLostToken   int64   `json:"delay_lost_token,omitempty"`
	DelayLeftSeconds float64 `json:"delay_left_seconds,omitempty"`
}

// delaying marks e, the head of name's queue, if it waits out a lock
// delay: the name's delay record says a holding before it was lost.
func (c *ctl) delaying(ctx context.Context, name string, e *entry) error {
	rec, err := lease.InspectDelay(ctx, c.cli, name)
	if err != nil {
		return err
	}
	if rec.State == "lost" && rec.Token < e.Token && rec.Left > 0 {
		e.DelayLostToken, e.DelayLeftSeconds = rec.Token, rec.Left.Seconds()
	}
	return nil
}

// delayCell is a delay in a table: "-" for none.
func delayCell(e entry) string {
	if e.DelayLostToken == 0 {
		return "-"
	}
	return fmt.Sprintf("%vs (lost %d)", e.DelayLeftSeconds, e.DelayLostToken)
}

func entryOf(e lease.QueueEntry) entry {
	return entry{Key: e.Key, Token: e.Token, Lease: strconv.FormatInt(int64(e.Lease), 16), TTLSeconds: e.TTL.Seconds(),
		Owner: e.Owner, Value: e.Value, Mode: e.Mode.String()}
}

// shownValue is the entry's value as a table shows it: a reader's key
// holds a marker, which the MODE column already says, and a lock's key
// holds nothing; an election's candidate has a value worth showing.
func (e entry) shownValue() string {
	if e.Mode == lease.Read.String() && e.Value == lease.ReaderValue {
		return ""
	}
	return e.Value
}

// ownerCell is an owner in a table: "-" for none, so that the columns
// stay apart for a reader and for awk.
func ownerCell(owner string) string {
	if owner == "" {
		return "-"
	}
	return owner
}

// lockInfo is one lock in list's output.
type lockInfo struct {
	Name    string `json:"name"`
	Holder  entry  `json:"holder"`  // the oldest holder
	Holders int    `json:"holders"` // more than one: readers share it
	Waiters int    `json:"waiters"`
}

// list finds the locks under prefix (keys named after their lease, by the
// queue-key rule) and shows each one's holder and waiter count.
func (c *ctl) list(ctx context.Context, prefix string) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	locks, err := c.locksUnder(rctx, prefix)
	if err != nil {
		return err
	}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(orEmpty(locks))
	}
	if len(locks) == 0 {
		// A bare header would read as a failure to look, or to connect.
		_, err := fmt.Fprintf(c.out, "no locks held under %s\n", prefix)
		return err
	}
	header := []string{"NAME", "MODE", "HOLDERS", "TOKEN", "LEASE", "TTL", "WAITERS", "HOLDER KEY", "OWNER"}
	withValue := slices.ContainsFunc(locks, func(l lockInfo) bool { return l.Holder.shownValue() != "" })
	if withValue {
		header = append(header, "VALUE")
	}
	withDelay := slices.ContainsFunc(locks, func(l lockInfo) bool { return l.Holder.DelayLostToken != 0 })
	if withDelay {
		header = append(header, "DELAY")
	}
	var rows [][]string
	for _, l := range locks {
		h := l.Holder
		row := []string{l.Name, h.Mode, strconv.Itoa(l.Holders), strconv.FormatInt(h.Token, 10), h.Lease,
			fmt.Sprintf("%vs", h.TTLSeconds), strconv.Itoa(l.Waiters), h.Key, ownerCell(h.Owner)}
		if withValue {
			row = append(row, strconv.Quote(h.shownValue()))
		}
		if withDelay {
			row = append(row, delayCell(h))
		}
		rows = append(rows, row)
	}
	return writeTable(c.out, header, rows)
}

// locksUnder reads the locks under prefix, in name order.
func (c *ctl) locksUnder(ctx context.Context, prefix string) ([]lockInfo, error) {
	resp, err := c.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	seen := map[string]bool{}
	var names []string
	for _, kv := range resp.Kvs {
		if name, ok := lease.QueueName(kv.Key, clientv3.LeaseID(kv.Lease)); ok && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var locks []lockInfo
	for _, name := range names {
		entries, err := lease.Inspect(ctx, c.cli, name)
		if err != nil {
			return nil, err
		}
		if len(entries) == 0 {
			continue // released since the first read
		}
		holding := lease.Holding(entries)
		info := lockInfo{Name: name, Holder: entryOf(entries[0]), Holders: holding, Waiters: len(entries) - holding}
		if err := c.delaying(ctx, name, &info.Holder); err != nil {
			return nil, err
		}
		locks = append(locks, info)
	}
	return locks, nil
}

// show prints the whole queue of name, holder first.
func (c *ctl) show(ctx context.Context, name string) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	queue, err := lease.Inspect(rctx, c.cli, name)
	if err != nil {
		return err
	}
	entries := []entry{}
	for _, e := range queue {
		entries = append(entries, entryOf(e))
	}
	if len(entries) > 0 {
		if err := c.delaying(rctx, name, &entries[0]); err != nil {
			return err
		}
	}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(entries)
	}
	if len(entries) == 0 {
		fmt.Fprintf(c.out, "%s: not held\n", name)
		return c.showStray(rctx, name)
	}
	header := []string{"POS", "MODE", "TOKEN", "LEASE", "TTL", "KEY", "OWNER"}
	withValue := slices.ContainsFunc(entries, func(e entry) bool { return e.shownValue() != "" })
	if withValue {
		header = append(header, "VALUE")
	}
	holding := lease.Holding(queue)
	var rows [][]string
	for i, e := range entries {
		pos := "holder"
		if i >= holding {
			pos = strconv.Itoa(i - holding + 1)
		} else if e.DelayLostToken != 0 {
			pos = "delaying"
		}
		row := []string{pos, e.Mode, strconv.FormatInt(e.Token, 10), e.Lease, queue[i].TTL.String(), e.Key, ownerCell(e.Owner)}
		if withValue {
			row = append(row, strconv.Quote(e.shownValue()))
		}
		rows = append(rows, row)
	}
	if err := writeTable(c.out, header, rows); err != nil {
		return err
	}
	if h := entries[0]; h.DelayLostToken != 0 {
		fmt.Fprintf(c.out, "%s: the lock delay after the loss of token %d has about %vs left: a holder with a lock delay (lockctl run) waits it out before it starts its command\n",
			name, h.DelayLostToken, h.DelayLeftSeconds)
	}
	return c.showStray(rctx, name)
}

// showStray prints a note for each key under name that is named like a
// lock key but is not attached to the lease it is named after: someone's
// put moved it off its lease. It is no lock to this library, which grants
// past it, but etcd's own lock code (concurrency.Mutex, etcdctl lock)
// still waits behind it.
func (c *ctl) showStray(ctx context.Context, name string) error {
	pfx := name + "/"
	resp, err := c.cli.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("show %s: %w", name, err)
	}
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), pfx)
		id, perr := strconv.ParseInt(rest, 16, 64)
		if perr != nil || rest != strconv.FormatInt(id, 16) || kv.Lease == id {
			continue
		}
		fmt.Fprintf(c.out, "note: %s (created at %d) is not attached to lease %s but to %x: no lock, though etcd's own lock code waits behind it; delete it if nothing uses it\n",
			kv.Key, kv.CreateRevision, rest, kv.Lease)
	}
	return nil
}

// writeTable writes header and rows in aligned columns, at least two
// spaces apart.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// Why records skips a key, as its -all table says it.
const (
	skipLeased   = "on a lease: a lock's or session's key"
	skipNotToken = "value is not a fence token"
)

// skipCounted is how records' summary counts the keys skipped for each
// reason, in this order.
var skipCounted = []struct{ why, counted string }{
	{skipLeased, "on a lease"},
	{skipNotToken, "not a fence token"},
}

// recordInfo is one key in records' output: a fence record with its
// highest token, or (with -all) a key skipped, and why.
type recordInfo struct {
	Key     string `json:"key"`
	Highest *int64 `json:"highest,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// recordOf says what kv is to records. A key on a lease is never a fence
// record, whatever its value: records are written without a lease, so
// that they outlive every holder, and lock keys are always on one.
func recordOf(kv *mvccpb.KeyValue) recordInfo {
	ri := recordInfo{Key: string(kv.Key)}
	if kv.Lease != 0 {
		ri.Skipped = skipLeased
		return ri
	}
	h, err := fence.DecodeToken(string(kv.Value))
	if err != nil {
		ri.Skipped = skipNotToken
		return ri
	}
	ri.Highest = &h
	return ri
}

// records prints the fence records under prefix with their highest token,
// and counts the other keys, or lists them if all.
func (c *ctl) records(ctx context.Context, prefix string, all bool) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("records %s: %w", prefix, err)
	}
	var recs, skipped []recordInfo
	for _, kv := range resp.Kvs {
		if ri := recordOf(kv); ri.Highest != nil {
			recs = append(recs, ri)
		} else {
			skipped = append(skipped, ri)
		}
	}
	if c.cfg.json {
		if all {
			recs = append(recs, skipped...)
		}
		return json.NewEncoder(c.out).Encode(orEmpty(recs))
	}
	rows := [][]string{}
	for _, r := range recs {
		rows = append(rows, []string{r.Key, strconv.FormatInt(*r.Highest, 10)})
	}
	if err := writeTable(c.out, []string{"KEY", "HIGHEST TOKEN"}, rows); err != nil || len(skipped) == 0 {
		return err
	}
	if !all {
		_, err := fmt.Fprintf(c.out, "(%s; records -all lists them)\n", skipSummary(skipped))
		return err
	}
	rows = rows[:0]
	for _, r := range skipped {
		rows = append(rows, []string{r.Key, r.Skipped})
	}
	fmt.Fprintln(c.out)
	return writeTable(c.out, []string{"SKIPPED KEY", "WHY"}, rows)
}

// skipSummary counts the keys skipped by reason: "3 other keys skipped:
// 2 on a lease, 1 not a fence token".
func skipSummary(skipped []recordInfo) string {
	n := map[string]int{}
	for _, r := range skipped {
		n[r.Skipped]++
	}
	var parts []string
	for _, s := range skipCounted {
		if n[s.why] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s.why], s.counted))
		}
	}
	keys := "keys"
	if len(skipped) == 1 {
		keys = "key"
	}
	return fmt.Sprintf("%d other %s skipped: %s", len(skipped), keys, strings.Join(parts, ", "))
}

// audit is release's record of what it did.
type audit struct {
	Time     time.Time `json:"time"`
	Operator string    `json:"operator"`
	EtcdUser string    `json:"etcd_user,omitempty"`
	Action   string    `json:"action"`
	Lock     string    `json:"lock"`
	Key      string    `json:"key"`
	Token    int64     `json:"token"`
	Lease    string    `json:"lease"`
}

// release deletes the key of the holder of name whose token is token (one
// of several when readers share it), guarded by the key's creation
// revision.
func (c *ctl) release(ctx context.Context, name string, token int64) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	entries, err := lease.Inspect(rctx, c.cli, name)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return fmt.Errorf("release %s: not held; nothing deleted", name)
	}
	h, ok := holderWith(entries, token)
	if !ok {
		return fmt.Errorf("release %s: token %d is not the holder's (holder %s has token %d); nothing deleted", name, token, h.Key, h.Token)
	}
	resp, err := c.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.Key), "=", token)).
		Then(clientv3.OpDelete(h.Key)).
		Commit()
	if err != nil {
		return fmt.Errorf("release %s: %w (the key may or may not be deleted: run show)", name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("release %s: the holder changed before the delete; nothing deleted", name)
	}
	user, _, _ := strings.Cut(c.cfg.user, ":")
	a := audit{Time: time.Now().UTC(), Operator: c.who, EtcdUser: user, Action: "release", Lock: name,
		Key: h.Key, Token: token, Lease: strconv.FormatInt(int64(h.Lease), 16)}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(a)
	}
	fmt.Fprintf(c.out, "audit: %s operator=%s etcd-user=%q released lock %q: deleted key %s (token %d, lease %s)\n",
		a.Time.Format(time.RFC3339), a.Operator, a.EtcdUser, a.Lock, a.Key, a.Token, a.Lease)
	return nil
}

// holderWith finds the holder with token among entries (a queue, as
// Inspect returns it); if none has it, the oldest holder and false.
func holderWith(entries []lease.QueueEntry, token int64) (lease.QueueEntry, bool) {
	for _, e := range entries[:lease.Holding(entries)] {
		if e.Token == token {
			return e, true
		}
	}
	return entries[0], false
}

// handoff is one line of watch's output.
type handoff struct {
	Time  time.Time `json:"time"`
	Lock  string    `json:"lock"`
	Token int64     `json:"token"`
	Lease string    `json:"lease"`
	Owner string    `json:"owner"`
	// OwnerError says why the owner could not be read; the watch goes on.
	OwnerError string `json:"owner_error,omitempty"`
	Value      string `json:"value,omitempty"`
}

// watch prints each new holder of name until ctx ends.
func (c *ctl) watch(ctx context.Context, name string) error {
	o, err := lease.Observe(ctx, c.cli, name)
	if err != nil {
		return err
	}
	defer o.Close()
	var last int64
	for ld := range o.Leaders() {
		if ld.Token == last {
			continue // a new value of the same holder, not a handoff
		}
		last = ld.Token
		if err := c.printHandoff(ctx, ld); err != nil {
			return err
		}
	}
	if errors.Is(o.Err(), context.Canceled) || ctx.Err() != nil {
		return nil // interrupted: the normal end
	}
	return o.Err()
}

// printHandoff prints the new holder ld, with its owner.
func (c *ctl) printHandoff(ctx context.Context, ld lease.Leader) error {
	leaseHex := ld.Key[strings.LastIndexByte(ld.Key, '/')+1:]
	h := handoff{Time: time.Now().UTC(), Lock: ld.Name, Token: ld.Token, Lease: leaseHex, Value: ld.Value}
	owner, err := c.ownerOf(ctx, leaseHex)
	h.Owner = owner
	if err != nil {
		// A read that failed now may work at the next handoff: the
		// watch, which outlasts etcd being away, goes on.
		h.OwnerError = err.Error()
		owner = "? (" + h.OwnerError + ")"
	}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(h)
	}
	line := fmt.Sprintf("%s  %s  token %d  lease %s  owner %s", h.Time.Format(time.RFC3339Nano), h.Lock, h.Token, h.Lease, ownerCell(owner))
	if h.Value != "" {
		line += fmt.Sprintf("  value %q", h.Value)
	}
	_, err = fmt.Fprintln(c.out, line)
	return err
}

// ownerOf reads the owner record of the session whose lease is leaseHex,
// as Inspect does for a queue entry: empty if there is none, or if the
// record is on another lease (that session did not write it).
func (c *ctl) ownerOf(ctx context.Context, leaseHex string) (string, error) {
	u, err := strconv.ParseUint(leaseHex, 16, 64)
	if err != nil {
		return "", nil // not named after a lease: no session of this package
	}
	id := clientv3.LeaseID(u)
	rctx, cancel := c.request(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, lease.OwnerKey(id))
	if err != nil {
		return "", fmt.Errorf("read owner: %w", err)
	}
	if len(resp.Kvs) == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) != id {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// orEmpty makes a nil slice encode as [] rather than null.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// whoAmI names the operator for the audit line: user@host.
func whoAmI() string {
	host, _ := os.Hostname()
	return operatorName(os.Getenv("USER"), os.Getuid(), user.LookupId) + "@" + host
}

// operatorName is the operator's name: $USER (env), else the name of the
// account of uid, as lookup finds it (su, cron, containers and systemd
// units often leave USER unset), else the uid itself, marked as one so
// that nobody reads it as a name.
func operatorName(env string, uid int, lookup func(uid string) (*user.User, error)) string {
	if env != "" {
		return env
	}
	if u, err := lookup(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid:" + strconv.Itoa(uid)
}
