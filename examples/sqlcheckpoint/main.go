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
	tl := exampleenv.NewTimeline(out)
	shard := fmt.Sprintf("shard-%x", time.Now().UnixNano()&0xffffff)
	lockName := "sqlcheckpoint/" + shard

	// Worker A reaches etcd through a proxy, so its network can fail.
	p, cliA, closeA, err := exampleenv.ProxiedClient(cli.Endpoints()[0])
	if err != nil {
		return res, err
	}
	defer closeA()
	sa, err := lease.NewSession(ctx, cliA, lease.WithTTL(ttl))
	if err != nil {
		return res, err
	}
	defer sa.Close()
	la, err := sa.Lock(ctx, lockName)
	if err != nil {
		return res, err
	}
	res.aToken = la.Token()
	tl.Printf("A", "takes %s: token %d", shard, la.Token())
	commit := func(who string, l *lease.Lock, offset int64) error {
		err := f.Upsert(ctx, db, shard, l.Token(), sqlfence.Set("committed_offset", offset), sqlfence.Set("owner", who))
		if err == nil {
			tl.Printf(who, "commits offset %d with token %d", offset, l.Token())
		}
		return err
	}
	for _, off := range []int64{100, 200} {
		if err := commit("A", la, off); err != nil {
			return res, err
		}
	}
	if la.Err() != nil {
		return res, la.Err()
	}
	tl.Printf("A", "lock.Err() == nil: starts a long batch, records 201..300")

	key, err := cli.Get(ctx, la.Key())
	if err != nil {
		return res, err
	}
	watch, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := cli.Watch(watch, la.Key(), clientv3.WithRev(key.Header.Revision+1))
	p.BlackholeTx()
	p.BlackholeRx()
	cutAt := time.Now()
	tl.Printf("net", "A's connection to etcd fails (proxy blackholes both directions)")
	<-la.Done()
	tl.Printf("A", "(its early warning fires after %v: %v; A is deep in its batch and does not look)",
		time.Since(cutAt).Round(10*time.Millisecond), la.Err())
	if err := exampleenv.AwaitDelete(wch); err != nil {
		return res, err
	}
	tl.Printf("etcd", "A's lease expired %v after the cut: its lock key is deleted", time.Since(cutAt).Round(10*time.Millisecond))

	sb, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return res, err
	}
	defer sb.Close()
	lb, err := sb.Lock(ctx, lockName)
	if err != nil {
		return res, err
	}
	defer lb.Unlock(ctx)
	res.bToken = lb.Token()
	var from int64
	if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT committed_offset FROM %s WHERE shard = %s`, table, placeholder(dsn)), shard).Scan(&from); err != nil {
		return res, err
	}
	tl.Printf("B", "takes %s: token %d; resumes after offset %d", shard, lb.Token(), from)
	for _, off := range []int64{from + 100, from + 200} {
		if err := commit("B", lb, off); err != nil {
			return res, err
		}
	}

	p.UnblackholeTx()
	p.UnblackholeRx()
	tl.Printf("net", "A's network is back")
	err = commit("A", la, 300)
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		res.refused = true
		tl.Printf("A", "commit of offset 300 REFUSED: %v", err)
	case err != nil:
		return res, err
	default:
		tl.Printf("A", "commit of offset 300 ACCEPTED: the offset moved back")
	}

	if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT committed_offset, owner FROM %s WHERE shard = %s`, table, placeholder(dsn)), shard).Scan(&res.offset, &res.owner); err != nil {
		return res, err
	}
	tl.Printf("row", "%s: offset %d, committed by %s", shard, res.offset, res.owner)
	if !res.refused || res.owner != "B" || res.offset != from+200 {
		return res, errors.New("worker A's stale commit was not refused")
	}
	fmt.Fprintf(out, "\nA plain UPDATE would have set the offset back from %d to 300, and records %d..%d would be processed twice.\n", res.offset, 301, res.offset)
	return res, nil
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
