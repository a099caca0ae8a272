// Command sqlcheckpoint shows a shard worker committing its consumer offset
// to a SQL table through fence/sqlfence while a competing worker takes the
// shard over.
//
// Each worker holds the shard's lock through lease.Run, and every holding
// resumes the same way: a claim of the row with its token, then the read
// of the committed offset, in one transaction. Worker A commits offsets.
// During a long batch its connection to etcd fails (a real network
// partition, made with etcd's fault proxy), its lease expires, and worker B
// takes the shard with a larger token, claims the row and reads the
// offset. Before B has written anything, the partition heals and A commits
// the end of its batch: B's claim refuses it, so the offset B read cannot
// change under B. B commits further and releases the shard. lease.Run
// then takes the shard for A again, with a new token, and A resumes from
// the row, not from its memory.
//
// The table lives in a SQLite file in a temporary directory by default, or
// in PostgreSQL with -dsn. With neither -endpoints nor ETCD_ENDPOINTS it
// starts an embedded etcd. The exit status is 0 only if A's late commit was
// refused and A resumed after B's offset. The table's columns have
// defaults: a claim of a missing row creates it with its key and token
// only.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	_ "modernc.org/sqlite"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

const table = "leasefence_offsets"

func main() {
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	dsn := flag.String("dsn", "", "PostgreSQL connection string (default: a SQLite file in a temporary directory)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of the workers")
	flag.Parse()
	if _, err := run(*endpoints, *dsn, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqlcheckpoint:", err)
		os.Exit(1)
	}
}

// outcome is what a run ended with.
type outcome struct {
	aToken, bToken, resumeToken int64 // A's first holding, B's, A's second
	refused                     bool  // A's late commit was refused
	refusedBy                   int64 // the token that refused it
	bFrom                       int64 // the offset B resumed after
	bOffset                     int64 // the last offset B committed
	offset                      int64 // the row at the end
	owner                       string
}

func run(endpoints, dsn string, ttl time.Duration, out io.Writer) (outcome, error) {
	var res outcome
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, closeAll, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return res, err
	}
	defer closeAll()
	db, f, cleanup, err := openTable(ctx, dsn, out)
	if err != nil {
		return res, err
	}
	defer cleanup()
	shard := fmt.Sprintf("shard-%x", time.Now().UnixNano()&0xffffff)
	sh := &shardStory{db: db, f: f, dsn: dsn, shard: shard, tl: exampleenv.NewTimeline(out),
		started: make(chan *lease.Lock, 1), finish: make(chan struct{}), late: make(chan error, 1)}
	sh.endBatch = sync.OnceFunc(func() { close(sh.finish) })
	lockName := "sqlcheckpoint/" + shard

	// Worker A reaches etcd through a proxy, so its network can fail.
	p, cliA, closeA, err := exampleetcd.ProxiedClient(cli.Endpoints()[0])
	if err != nil {
		return res, err
	}
	defer closeA()
	aDone := make(chan error, 1)
	aStopped := make(chan struct{})
	go func() {
		defer close(aStopped)
		aDone <- lease.Run(ctx, cliA, lockName, sh.workerA, lease.WithTTL(ttl))
	}()
	defer func() { // if the story stops early, so does A
		cancel()
		sh.endBatch()
		<-aStopped
	}()

	var la *lease.Lock
	select {
	case la = <-sh.started:
	case err := <-aDone:
		return res, fmt.Errorf("worker A stopped: %v", err)
	}
	res.aToken = la.Token()
	if err := sh.cutUntilExpired(ctx, cli, p, la); err != nil {
		return res, err
	}
	// A's late commit arrives while B holds the shard, after B's claim and
	// read and before B's first commit.
	lateCommit := func() { sh.lateCommit(p, &res) }
	if err := lease.Run(ctx, cli, lockName, func(ctx context.Context, l *lease.Lock) error {
		res.bToken = l.Token()
		res.bFrom, res.bOffset, err = sh.workerB(ctx, l, lateCommit)
		return err
	}, lease.WithTTL(ttl)); err != nil {
		return res, fmt.Errorf("worker B: %w", err)
	}
	sh.tl.Printf("B", "done: releases %s", shard)
	if err := <-aDone; err != nil {
		return res, fmt.Errorf("worker A: %w", err)
	}
	res.resumeToken = sh.resumeToken
	if err := sh.readRow(ctx, &res); err != nil {
		return res, err
	}
	if !res.refused || res.bOffset != 400 || res.owner != "A" || res.offset != 500 || res.resumeToken <= res.bToken {
		return res, errors.New("worker A's stale commit was not refused, or A did not resume from B's offset")
	}
	fmt.Fprintf(out, "\nB's claim refused A's late commit before B wrote anything. After a plain read the row would still\n"+
		"have taken token %d: A's commit of 300 would have landed after B read %d, under B's feet.\n", res.aToken, res.bFrom)
	return res, nil
}

// shardStory is one shard, its offsets row, and the two workers that take
// it in turn through lease.Run: A, whose link to etcd goes through a fault
// proxy, then B, then A again.
type shardStory struct {
	db    *sql.DB
	f     *sqlfence.Fence
	dsn   string
	shard string
	tl    *exampleenv.Timeline

	started     chan *lease.Lock // A's first holding, once its batch is under way
	finish      chan struct{}    // closed when A's long batch may end
	endBatch    func()           // closes finish, once
	late        chan error       // the result of A's late commit
	calls       int              // holdings of A so far (only A's goroutine)
	resumeToken int64            // A's second holding
}

// commit writes offset to the shard's row, fenced by l's token. It uses
// l.WriteContext: a commit under way when the lock is lost still reaches
// the database and gets the fence's verdict.
func (sh *shardStory) commit(ctx context.Context, who string, l *lease.Lock, offset int64) error {
	wctx, cancel := l.WriteContext(ctx)
	defer cancel()
	err := sh.f.Upsert(wctx, sh.db, sh.shard, l.Token(), sqlfence.Set("committed_offset", offset), sqlfence.Set("owner", who))
	if err == nil {
		sh.tl.Printf(who, "commits offset %d with token %d", offset, l.Token())
	}
	return err
}

// resume starts a holding: it claims the shard's row with l's token, then
// reads the committed offset, in one transaction. From the claim on, no
// commit of an earlier holder lands, so the offset read stays true until
// this holding writes. A missing row is created by the claim, at offset 0.
func (sh *shardStory) resume(ctx context.Context, l *lease.Lock) (int64, error) {
	tx, err := sh.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := sh.f.Claim(ctx, tx, sh.shard, l.Token()); err != nil {
		return 0, err
	}
	var from int64
	q := fmt.Sprintf(`SELECT committed_offset FROM %s WHERE shard = %s`, table, placeholder(sh.dsn))
	if err := tx.QueryRowContext(ctx, q, sh.shard).Scan(&from); err != nil {
		return 0, err
	}
	return from, tx.Commit()
}

// workerA is A's work under the lock, called by lease.Run for each
// holding. The first holding commits two offsets, then starts a long batch
// that does not look at its context; the batch's commit comes late. The
// second holding resumes from what the row says, as every holding must.
func (sh *shardStory) workerA(ctx context.Context, l *lease.Lock) error {
	sh.calls++
	from, err := sh.resume(ctx, l)
	if err != nil {
		return err
	}
	if sh.calls > 1 {
		sh.resumeToken = l.Token()
		sh.tl.Printf("A", "lease.Run takes %s again: token %d; claims the row, resumes after offset %d", sh.shard, l.Token(), from)
		return sh.commit(ctx, "A", l, from+100)
	}
	sh.tl.Printf("A", "lease.Run takes %s: token %d; claims the row, resumes after offset %d", sh.shard, l.Token(), from)
	for _, off := range []int64{from + 100, from + 200} {
		if err := sh.commit(ctx, "A", l, off); err != nil {
			return err
		}
	}
	sh.tl.Printf("A", "starts a long batch, records %d..%d", from+201, from+300)
	sh.started <- l
	<-sh.finish // deep in the batch: A does not look at ctx
	err = sh.commit(ctx, "A", l, from+300)
	if err != nil {
		sh.tl.Printf("A", "commit of offset %d REFUSED: %v", from+300, err)
	} else {
		sh.tl.Printf("A", "commit of offset %d ACCEPTED: it landed after B's read", from+300)
	}
	sh.late <- err
	return err
}

// lateCommit gives A its network back and lets its long batch end, and
// waits for the verdict on the batch's late commit.
func (sh *shardStory) lateCommit(p proxy.Server, res *outcome) {
	p.UnblackholeTx()
	p.UnblackholeRx()
	sh.tl.Printf("net", "A's network is back; A finishes its batch")
	sh.endBatch()
	var stale *fence.StaleError
	if res.refused = errors.As(<-sh.late, &stale); res.refused {
		res.refusedBy = stale.Highest
	}
}

// cutUntilExpired cuts A from etcd until etcd has expired A's lease and
// deleted its lock key.
func (sh *shardStory) cutUntilExpired(ctx context.Context, cli *clientv3.Client, p proxy.Server, la *lease.Lock) error {
	key, err := cli.Get(ctx, la.Key())
	if err != nil {
		return err
	}
	watch, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := cli.Watch(watch, la.Key(), clientv3.WithRev(key.Header.Revision+1))
	p.BlackholeTx()
	p.BlackholeRx()
	cutAt := time.Now()
	sh.tl.Printf("net", "A's connection to etcd fails (proxy blackholes both directions)")
	<-la.Done()
	sh.tl.Printf("A", "(its early warning fires after %v: %v; A is deep in its batch and does not look)",
		time.Since(cutAt).Round(10*time.Millisecond), la.Err())
	if err := exampleenv.AwaitDelete(wch); err != nil {
		return err
	}
	sh.tl.Printf("etcd", "A's lease expired %v after the cut: its lock key is deleted", time.Since(cutAt).Round(10*time.Millisecond))
	return nil
}

// workerB is B's work under the lock: resume from the row (claim, then
// read), let A's late commit arrive (lateCommit), commit two batches,
// release. It returns the offset it resumed after and the last one it
// committed.
func (sh *shardStory) workerB(ctx context.Context, l *lease.Lock, lateCommit func()) (from, last int64, err error) {
	if from, err = sh.resume(ctx, l); err != nil {
		return 0, 0, err
	}
	sh.tl.Printf("B", "lease.Run takes %s: token %d; claims the row, resumes after offset %d", sh.shard, l.Token(), from)
	lateCommit()
	for _, off := range []int64{from + 100, from + 200} {
		if err := sh.commit(ctx, "B", l, off); err != nil {
			return 0, 0, err
		}
	}
	return from, from + 200, nil
}

// readRow reads the shard's row at the end.
func (sh *shardStory) readRow(ctx context.Context, res *outcome) error {
	q := fmt.Sprintf(`SELECT committed_offset, owner FROM %s WHERE shard = %s`, table, placeholder(sh.dsn))
	if err := sh.db.QueryRowContext(ctx, q, sh.shard).Scan(&res.offset, &res.owner); err != nil {
		return err
	}
	sh.tl.Printf("row", "%s: offset %d, committed by %s", sh.shard, res.offset, res.owner)
	return nil
}

// openTable opens the database and creates the offsets table with its
// fence column if it is not there yet. cleanup closes the database and
// removes the temporary SQLite file, if one was made.
func openTable(ctx context.Context, dsn string, out io.Writer) (db *sql.DB, f *sqlfence.Fence, cleanup func(), err error) {
	dialect, driver, dir := sqlfence.Postgres, "pgx", ""
	if dsn == "" {
		if dir, err = os.MkdirTemp("", "sqlcheckpoint"); err != nil {
			return nil, nil, nil, err
		}
		path := filepath.Join(dir, "offsets.db")
		dialect, driver, dsn = sqlfence.SQLite, "sqlite", "file:"+path+"?_pragma=busy_timeout(10000)"
		fmt.Fprintf(out, "no -dsn given: offsets go to the SQLite file %s (removed at exit)\n", path)
	}
	cleanup = func() {
		if db != nil {
			db.Close()
		}
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if db, err = sql.Open(driver, dsn); err != nil {
		return nil, nil, nil, err
	}
	if f, err = sqlfence.New(dialect, table, "shard"); err != nil {
		return nil, nil, nil, err
	}
	// Defaults on every column: each run's shard is new, so A's first
	// claim creates the row, with only the key and the token.
	ddl := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (shard TEXT PRIMARY KEY, committed_offset BIGINT NOT NULL DEFAULT 0, owner TEXT NOT NULL DEFAULT '', %s)`, table, f.ColumnDDL())
	if _, err = db.ExecContext(ctx, ddl); err != nil {
		return nil, nil, nil, fmt.Errorf("creating %s: %w", table, err)
	}
	if dialect == sqlfence.Postgres {
		// The table may be left by an earlier version of this example,
		// without the defaults.
		alter := fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN committed_offset SET DEFAULT 0, ALTER COLUMN owner SET DEFAULT ''`, table)
		if _, err = db.ExecContext(ctx, alter); err != nil {
			return nil, nil, nil, fmt.Errorf("defaults of %s: %w", table, err)
		}
	}
	return db, f, cleanup, nil
}

func placeholder(dsn string) string {
	if dsn == "" {
		return "?"
	}
	return "$1"
}
