// Command lockctl shows and manages the locks of package lease (and of
// etcd's own concurrency package, which uses the same keys) for the people
// who run a cluster with them.
//
//	lockctl [flags] list PREFIX            locks under PREFIX: holder and waiter count
//	lockctl [flags] show NAME              the whole queue of lock NAME
//	lockctl [flags] records PREFIX         fence records under PREFIX, decoded
//	lockctl [flags] release -token T NAME  delete the holder's key, only if its token is T
//	lockctl [flags] watch NAME             print each handoff until interrupted
//
// Flags: -endpoints (default $ETCD_ENDPOINTS, else 127.0.0.1:2379), etcd's
// -cacert, -cert, -key, -user (name or name:password) and -password, -json
// for output a script reads, and -timeout for each request.
//
// release never deletes blindly: it reads the queue, refuses unless the
// current holder's token is T, and deletes that key in a transaction
// guarded by its creation revision, so a lock that changed hands meanwhile
// is left alone. It prints one audit line: who, what, when. The lost
// holder's own fenced writes are refused from then on.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

const usage = `usage: lockctl [flags] list PREFIX | show NAME | records PREFIX | release -token T NAME | watch NAME`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, whoAmI()); err != nil {
		fmt.Fprintln(os.Stderr, "lockctl:", err)
		os.Exit(1)
	}
}

// config is what the global flags say.
type config struct {
	endpoints, cacert, cert, key, user, password string
	json                                         bool
	timeout                                      time.Duration
}

// run parses args and runs one command, writing to out. who names the
// operator in release's audit line.
func run(ctx context.Context, args []string, out io.Writer, who string) error {
	var cfg config
	fs := flag.NewFlagSet("lockctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.endpoints, "endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else 127.0.0.1:2379)")
	fs.StringVar(&cfg.cacert, "cacert", "", "CA bundle to verify the servers' certificates")
	fs.StringVar(&cfg.cert, "cert", "", "client certificate")
	fs.StringVar(&cfg.key, "key", "", "client certificate's key")
	fs.StringVar(&cfg.user, "user", "", "etcd user, as name or name:password")
	fs.StringVar(&cfg.password, "password", "", "etcd user's password")
	fs.BoolVar(&cfg.json, "json", false, "print JSON")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "timeout of each request")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%v\n%s", err, usage)
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return errors.New(usage)
	}
	cmd, rest := rest[0], rest[1:]
	var token int64
	if cmd == "release" {
		rfs := flag.NewFlagSet("release", flag.ContinueOnError)
		rfs.SetOutput(io.Discard)
		rfs.Int64Var(&token, "token", 0, "the holder's token")
		if err := rfs.Parse(rest); err != nil || rfs.NArg() != 1 || token <= 0 {
			return fmt.Errorf("release needs -token T (T > 0) and one NAME\n%s", usage)
		}
		rest = rfs.Args()
	}
	if len(rest) != 1 {
		return errors.New(usage)
	}
	cli, err := connect(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	c := &ctl{cli: cli, cfg: cfg, out: out}
	switch cmd {
	case "list":
		return c.list(ctx, rest[0])
	case "show":
		return c.show(ctx, rest[0])
	case "records":
		return c.records(ctx, rest[0])
	case "release":
		return c.release(ctx, rest[0], token, who)
	case "watch":
		return c.watch(ctx, rest[0])
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// connect opens a client as the flags say, with etcd's TLS and auth.
func connect(cfg config) (*clientv3.Client, error) {
	eps := cfg.endpoints
	if eps == "" {
		eps = os.Getenv("ETCD_ENDPOINTS")
	}
	if eps == "" {
		eps = "127.0.0.1:2379"
	}
	cc := clientv3.Config{Endpoints: strings.Split(eps, ","), DialTimeout: cfg.timeout, Logger: zap.NewNop()}
	if cfg.cacert != "" || cfg.cert != "" {
		info := transport.TLSInfo{TrustedCAFile: cfg.cacert, CertFile: cfg.cert, KeyFile: cfg.key}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		cc.TLS = tc
	}
	if cfg.user != "" {
		name, pw, ok := strings.Cut(cfg.user, ":")
		if !ok {
			pw = cfg.password
		}
		cc.Username, cc.Password = name, pw
	}
	return clientv3.New(cc)
}

// ctl runs the commands.
type ctl struct {
	cli *clientv3.Client
	cfg config
	out io.Writer
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
	Value      string  `json:"value"`
	Mode       string  `json:"mode"`
}

func entryOf(e lease.QueueEntry) entry {
	return entry{Key: e.Key, Token: e.Token, Lease: strconv.FormatInt(int64(e.Lease), 16), TTLSeconds: e.TTL.Seconds(), Value: e.Value, Mode: e.Mode.String()}
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
	resp, err := c.cli.Get(rctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return err
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
		entries, err := lease.Inspect(rctx, c.cli, name)
		if err != nil {
			return err
		}
		if len(entries) == 0 {
			continue // released since the first read
		}
		holding := lease.Holding(entries)
		locks = append(locks, lockInfo{Name: name, Holder: entryOf(entries[0]), Holders: holding, Waiters: len(entries) - holding})
	}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(orEmpty(locks))
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tHOLDERS\tTOKEN\tLEASE\tTTL\tWAITERS\tHOLDER KEY\tVALUE")
	for _, l := range locks {
		h := l.Holder
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%vs\t%d\t%s\t%q\n", l.Name, h.Mode, l.Holders, h.Token, h.Lease, h.TTLSeconds, l.Waiters, h.Key, h.Value)
	}
	return tw.Flush()
}

// show prints the whole queue of name, holder first.
func (c *ctl) show(ctx context.Context, name string) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	entries, err := lease.Inspect(rctx, c.cli, name)
	if err != nil {
		return err
	}
	if c.cfg.json {
		out := []entry{}
		for _, e := range entries {
			out = append(out, entryOf(e))
		}
		return json.NewEncoder(c.out).Encode(out)
	}
	if len(entries) == 0 {
		fmt.Fprintf(c.out, "%s: not held\n", name)
		return nil
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POS\tMODE\tTOKEN\tLEASE\tTTL\tKEY\tVALUE")
	holding := lease.Holding(entries)
	for i, e := range entries {
		pos := "holder"
		if i >= holding {
			pos = strconv.Itoa(i - holding + 1)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%x\t%v\t%s\t%q\n", pos, e.Mode, e.Token, int64(e.Lease), e.TTL, e.Key, e.Value)
	}
	return tw.Flush()
}

// recordInfo is one fence record in records' output.
type recordInfo struct {
	Key     string `json:"key"`
	Highest int64  `json:"highest,omitempty"`
	Error   string `json:"error,omitempty"`
}

// records prints the fence records under prefix with their highest token.
func (c *ctl) records(ctx context.Context, prefix string) error {
	rctx, cancel := c.request(ctx)
	defer cancel()
	recs, err := fence.ReadRecords(rctx, c.cli, prefix)
	if err != nil {
		return err
	}
	var infos []recordInfo
	for _, r := range recs {
		ri := recordInfo{Key: r.Key, Highest: r.Highest}
		if r.Err != nil {
			ri.Error = "not a fence record"
		}
		infos = append(infos, ri)
	}
	if c.cfg.json {
		return json.NewEncoder(c.out).Encode(orEmpty(infos))
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHIGHEST TOKEN")
	for _, r := range infos {
		highest := strconv.FormatInt(r.Highest, 10)
		if r.Error != "" {
			highest = "(" + r.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\n", r.Key, highest)
	}
	return tw.Flush()
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
func (c *ctl) release(ctx context.Context, name string, token int64, who string) error {
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
	a := audit{Time: time.Now().UTC(), Operator: who, EtcdUser: user, Action: "release", Lock: name,
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
	Value string    `json:"value,omitempty"`
}

// watch prints each new holder of name until ctx ends.
func (c *ctl) watch(ctx context.Context, name string) error {
	o, err := lease.Observe(ctx, c.cli, name)
	if err != nil {
		return err
	}
	defer o.Close()
	enc := json.NewEncoder(c.out)
	var last int64
	for ld := range o.Leaders() {
		if ld.Token == last {
			continue // a new value of the same holder, not a handoff
		}
		last = ld.Token
		h := handoff{Time: time.Now().UTC(), Lock: name, Token: ld.Token, Lease: ld.Key[strings.LastIndexByte(ld.Key, '/')+1:], Value: ld.Value}
		if c.cfg.json {
			if err := enc.Encode(h); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(c.out, "%s  %s  token %d  lease %s  %q\n", h.Time.Format(time.RFC3339Nano), name, h.Token, h.Lease, h.Value)
	}
	if errors.Is(o.Err(), context.Canceled) || ctx.Err() != nil {
		return nil // interrupted: the normal end
	}
	return o.Err()
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
	user := os.Getenv("USER")
	if user == "" {
		user = strconv.Itoa(os.Getuid())
	}
	host, _ := os.Hostname()
	return user + "@" + host
}
