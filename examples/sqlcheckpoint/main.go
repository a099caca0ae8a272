// Command sqlcheckpoint shows a shard worker committing its consumer offset
// to a SQL table through fence/sqlfence while a competing worker takes the
// shard over.
//
// Worker A holds the shard's lock and commits offsets. During a long batch
// its connection to etcd fails (a real network partition, made with etcd's
// fault proxy), its lease expires, and worker B takes the shard with a
// larger token, resumes from the committed offset and commits further. The
// partition heals and A commits the end of its batch: the row's fence
// token refuses it, so the offset never moves back.
//
// The table lives in a SQLite file in a temporary directory by default, or
// in PostgreSQL with -dsn. With neither -endpoints nor ETCD_ENDPOINTS it
// starts an embedded etcd. The exit status is 0 only if A's late commit was
// refused and the row holds B's offset.
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
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	_ "modernc.org/sqlite"

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
	aToken, bToken int64
	refused        bool
	offset         int64
	owner          string
}

func run(endpoints, dsn string, ttl time.Duration, out io.Writer) (outcome, error) {
	var res outcome
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, closeAll, err := exampleenv.Connect(ctx, endpoints, out)
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
	sh := &shardStory{ctx: ctx, cli: cli, db: db, f: f, dsn: dsn, ttl: ttl, shard: shard,
		lockName: "sqlcheckpoint/" + shard, tl: exampleenv.NewTimeline(out)}
	defer sh.closers.Run()

	if err := sh.startA(&res); err != nil {
		return res, err
	}
	if err := sh.cutA(); err != nil {
		return res, err
	}
	from, err := sh.takeOverB(&res)
	if err != nil {
		return res, err
	}
	if err := sh.lateCommitA(&res); err != nil {
		return res, err
	}
	if err := sh.readRow(&res); err != nil {
		return res, err
	}
	if !res.refused || res.owner != "B" || res.offset != from+200 {
		return res, errors.New("worker A's stale commit was not refused")
	}
	fmt.Fprintf(out, "\nA plain UPDATE would have set the offset back from %d to 300, and records %d..%d would be processed twice.\n", res.offset, 301, res.offset)
	return res, nil
}

// shardStory is one shard, its offsets row, and the two workers that take
// it in turn: A, whose link to etcd goes through a fault proxy, then B.
type shardStory struct {
	ctx      context.Context
	cli      *clientv3.Client
	db       *sql.DB
	f        *sqlfence.Fence
	dsn      string
	ttl      time.Duration
	shard    string
	lockName string
	tl       *exampleenv.Timeline
	closers  exampleenv.Cleanup

	proxyA proxy.Server
	la     *lease.Lock
}

// commit writes offset to the shard's row, fenced by l's token.
func (sh *shardStory) commit(who string, l *lease.Lock, offset int64) error {
	err := sh.f.Upsert(sh.ctx, sh.db, sh.shard, l.Token(), sqlfence.Set("committed_offset", offset), sqlfence.Set("owner", who))
	if err == nil {
		sh.tl.Printf(who, "commits offset %d with token %d", offset, l.Token())
	}
	return err
}

// startA takes the shard for A, through its proxy, and commits two
// offsets; A then starts a long batch.
func (sh *shardStory) startA(res *outcome) error {
	p, cliA, closeA, err := exampleenv.ProxiedClient(sh.cli.Endpoints()[0])
	if err != nil {
		return err
	}
	sh.closers.Add(closeA)
	sh.proxyA = p
	sa, err := lease.NewSession(sh.ctx, cliA, lease.WithTTL(sh.ttl))
	if err != nil {
		return err
	}
	sh.closers.Add(func() { sa.Close() })
	if sh.la, err = sa.Lock(sh.ctx, sh.lockName); err != nil {
		return err
	}
	res.aToken = sh.la.Token()
	sh.tl.Printf("A", "takes %s: token %d", sh.shard, sh.la.Token())
	for _, off := range []int64{100, 200} {
		if err := sh.commit("A", sh.la, off); err != nil {
			return err
		}
	}
	if err := sh.la.Err(); err != nil {
		return err
	}
	sh.tl.Printf("A", "lock.Err() == nil: starts a long batch, records 201..300")
	return nil
}

// cutA cuts A from etcd until etcd has expired A's lease and deleted its
// lock key; A, deep in its batch, does not look at its early warning.
func (sh *shardStory) cutA() error {
	key, err := sh.cli.Get(sh.ctx, sh.la.Key())
	if err != nil {
		return err
	}
	watch, stopWatch := context.WithCancel(sh.ctx)
	defer stopWatch()
	wch := sh.cli.Watch(watch, sh.la.Key(), clientv3.WithRev(key.Header.Revision+1))
	sh.proxyA.BlackholeTx()
	sh.proxyA.BlackholeRx()
	cutAt := time.Now()
	sh.tl.Printf("net", "A's connection to etcd fails (proxy blackholes both directions)")
	<-sh.la.Done()
	sh.tl.Printf("A", "(its early warning fires after %v: %v; A is deep in its batch and does not look)",
		time.Since(cutAt).Round(10*time.Millisecond), sh.la.Err())
	if err := exampleenv.AwaitDelete(wch); err != nil {
		return err
	}
	sh.tl.Printf("etcd", "A's lease expired %v after the cut: its lock key is deleted", time.Since(cutAt).Round(10*time.Millisecond))
	return nil
}

// takeOverB takes the shard for B, which resumes from the committed offset
// and commits two more. It returns the offset B resumed from.
func (sh *shardStory) takeOverB(res *outcome) (int64, error) {
	sb, err := lease.NewSession(sh.ctx, sh.cli, lease.WithTTL(sh.ttl))
	if err != nil {
		return 0, err
	}
	sh.closers.Add(func() { sb.Close() })
	lb, err := sb.Lock(sh.ctx, sh.lockName)
	if err != nil {
		return 0, err
	}
	sh.closers.Add(func() { lb.Unlock(sh.ctx) })
	res.bToken = lb.Token()
	var from int64
	q := fmt.Sprintf(`SELECT committed_offset FROM %s WHERE shard = %s`, table, placeholder(sh.dsn))
	if err := sh.db.QueryRowContext(sh.ctx, q, sh.shard).Scan(&from); err != nil {
		return 0, err
	}
	sh.tl.Printf("B", "takes %s: token %d; resumes after offset %d", sh.shard, lb.Token(), from)
	for _, off := range []int64{from + 100, from + 200} {
		if err := sh.commit("B", lb, off); err != nil {
			return 0, err
		}
	}
	return from, nil
}

// lateCommitA heals A's network; A finishes its batch and commits offset
// 300 with its old token.
func (sh *shardStory) lateCommitA(res *outcome) error {
	sh.proxyA.UnblackholeTx()
	sh.proxyA.UnblackholeRx()
	sh.tl.Printf("net", "A's network is back")
	err := sh.commit("A", sh.la, 300)
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		res.refused = true
		sh.tl.Printf("A", "commit of offset 300 REFUSED: %v", err)
	case err != nil:
		return err
	default:
		sh.tl.Printf("A", "commit of offset 300 ACCEPTED: the offset moved back")
	}
	return nil
}

// readRow reads the shard's row back.
func (sh *shardStory) readRow(res *outcome) error {
	q := fmt.Sprintf(`SELECT committed_offset, owner FROM %s WHERE shard = %s`, table, placeholder(sh.dsn))
	if err := sh.db.QueryRowContext(sh.ctx, q, sh.shard).Scan(&res.offset, &res.owner); err != nil {
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
	ddl := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (shard TEXT PRIMARY KEY, committed_offset BIGINT NOT NULL, owner TEXT NOT NULL, %s)`, table, f.ColumnDDL())
	if _, err = db.ExecContext(ctx, ddl); err != nil {
		return nil, nil, nil, fmt.Errorf("creating %s: %w", table, err)
	}
	return db, f, cleanup, nil
}

func placeholder(dsn string) string {
	if dsn == "" {
		return "?"
	}
	return "$1"
}
