// Package test runs package sqlfence against real databases (SQLite, and
// PostgreSQL when LEASEFENCE_POSTGRES_DSN names one). It is a module of its
// own so that the drivers stay out of the graph of sqlfence's users.
package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// EnvPostgres points the PostgreSQL tests at a server; .ci/run starts one.
const EnvPostgres = "LEASEFENCE_POSTGRES_DSN"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type backend struct {
	name    string
	dialect sqlfence.Dialect
	open    func(t testing.TB) *sql.DB
}

func backends() []backend {
	return []backend{
		{"sqlite", sqlfence.SQLite, func(t testing.TB) *sql.DB {
			path := filepath.Join(t.TempDir(), "fence.db")
			db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}},
		{"postgres", sqlfence.Postgres, func(t testing.TB) *sql.DB {
			dsn := os.Getenv(EnvPostgres)
			if dsn == "" && os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set, and CI=true: the PostgreSQL tests must run", EnvPostgres)
			}
			if dsn == "" {
				t.Skipf("PostgreSQL tests skipped: set %s to a server's DSN (.ci/run starts one)", EnvPostgres)
			}
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}},
	}
}

var tableSeq sync.Mutex
var tableN int

// setup creates a fresh table with an awkward name (quoting matters).
func setup(t testing.TB, b backend) (*sql.DB, *sqlfence.Fence, string) {
	t.Helper()
	return newTable(t, b, "payload TEXT", true)
}

// newTable creates a fresh table with an awkward name, an id column and
// cols, and with the fence column if fenced. It returns the table's name
// quoted.
func newTable(t testing.TB, b backend, cols string, fenced bool, opts ...sqlfence.Option) (*sql.DB, *sqlfence.Fence, string) {
	t.Helper()
	db := b.open(t)
	tableSeq.Lock()
	tableN++
	table := fmt.Sprintf(`ck "%d" %d`, os.Getpid(), tableN)
	tableSeq.Unlock()
	f, err := sqlfence.New(b.dialect, table, "id", opts...)
	if err != nil {
		t.Fatal(err)
	}
	quoted := `"` + strings.ReplaceAll(table, `"`, `""`) + `"`
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (id TEXT PRIMARY KEY, %s)`, quoted, cols)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP TABLE "+quoted) })
	if !fenced {
		return db, f, quoted
	}
	if _, err := db.ExecContext(ctx, f.AddColumnDDL()); err != nil {
		t.Fatalf("AddColumnDDL: %v", err)
	}
	return db, f, quoted
}

func payload(t testing.TB, db *sql.DB, table, id string) (string, int64) {
	t.Helper()
	var p string
	var tok int64
	if err := db.QueryRow(fmt.Sprintf(`SELECT payload, fence_token FROM %s WHERE id = '%s'`, table, id)).Scan(&p, &tok); err != nil {
		t.Fatal(err)
	}
	return p, tok
}

func TestFencedWrites(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, table := setup(t, b)
			ctx := context.Background()
			if err := f.Update(ctx, db, "a", 5, sqlfence.Set("payload", "x")); !errors.Is(err, sqlfence.ErrMissing) {
				t.Fatalf("Update of a missing row: %v, want ErrMissing", err)
			}
			if err := f.Upsert(ctx, db, "a", 9, sqlfence.Set("payload", "nine")); err != nil {
				t.Fatalf("first Upsert: %v", err)
			}
			for _, tok := range []int64{9, 10} { // equal, then 10 after 9
				if err := f.Update(ctx, db, "a", tok, sqlfence.Set("payload", fmt.Sprint(tok))); err != nil {
					t.Fatalf("Update token %d: %v", tok, err)
				}
			}
			for _, write := range []func() error{
				func() error { return f.Update(ctx, db, "a", 9, sqlfence.Set("payload", "stale")) },
				func() error { return f.Upsert(ctx, db, "a", 9, sqlfence.Set("payload", "stale")) },
			} {
				err := write()
				var se *fence.StaleError
				if !errors.As(err, &se) || se.Highest != 10 || se.Token != 9 {
					t.Fatalf("stale write: %v, want StaleError 9 < 10", err)
				}
			}
			if p, tok := payload(t, db, table, "a"); p != "10" || tok != 10 {
				t.Fatalf("row = %q@%d, want 10@10", p, tok)
			}
			rolledBack(ctx, t, db, f, table)
		})
	}
}

// rolledBack: a write inside the caller's transaction, rolled back, leaves
// row "a" (10@10) as it was.
func rolledBack(ctx context.Context, t *testing.T, db *sql.DB, f *sqlfence.Fence, table string) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, tx, "a", 11, sqlfence.Set("payload", "eleven")); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	if p, tok := payload(t, db, table, "a"); p != "10" || tok != 10 {
		t.Fatalf("row = %q@%d after rollback, want 10@10", p, tok)
	}
}

func TestBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	if _, err := sqlfence.New(sqlfence.SQLite, "", "id"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("empty table: %v", err)
	}
	if _, err := sqlfence.New(sqlfence.Dialect(9), "t", "id"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("unknown dialect: %v", err)
	}
	for _, b := range backends()[:1] {
		db, f, table := setup(t, b)
		ctx := context.Background()
		if err := f.Upsert(ctx, db, "a", 3, sqlfence.Set("payload", "ok")); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			f.Update(ctx, db, "a", 0, sqlfence.Set("payload", "x")),
			f.Upsert(ctx, db, "a", -1, sqlfence.Set("payload", "x")),
			f.Update(ctx, db, "a", 4, sqlfence.Set("fence_token", 99)),
			f.Update(ctx, db, "a", 4, sqlfence.Set("", "x")),
		} {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Errorf("bad write: %v, want ErrInvalidArgument", err)
			}
		}
		if p, tok := payload(t, db, table, "a"); p != "ok" || tok != 3 {
			t.Fatalf("bad input changed the row: %q@%d", p, tok)
		}
	}
}

// Eight writers with interleaved tokens hammer one row. A write that
// finished before another started must not have a higher token than it if
// both were accepted, and the row ends with the highest token's payload.
func TestConcurrentWriters(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, table := setup(t, b)
			const writers, each = 8, 25
			type accepted struct {
				token      int64
				start, end time.Time
			}
			var mu sync.Mutex
			var log []accepted
			var stale int
			var wg sync.WaitGroup
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						tok := int64(i*writers + w + 1)
						start := time.Now()
						err := f.Upsert(context.Background(), db, "row", tok, sqlfence.Set("payload", fmt.Sprint(tok)))
						end := time.Now()
						mu.Lock()
						switch {
						case err == nil:
							log = append(log, accepted{tok, start, end})
						case errors.Is(err, fence.ErrStale):
							stale++
						default:
							t.Error(err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			sort.Slice(log, func(i, j int) bool { return log[i].end.Before(log[j].end) })
			for i, a := range log {
				for _, later := range log[i+1:] {
					if later.start.After(a.end) && later.token < a.token {
						t.Fatalf("token %d accepted after token %d had been", later.token, a.token)
					}
				}
			}
			top := int64(writers * each)
			if p, tok := payload(t, db, table, "row"); tok != top || p != fmt.Sprint(top) {
				t.Fatalf("row = %q@%d, want the highest token's payload %d", p, tok, top)
			}
			t.Logf("%d accepted, %d refused as stale", len(log), stale)
			if len(log)+stale != writers*each {
				t.Fatalf("%d outcomes for %d writes", len(log)+stale, writers*each)
			}
		})
	}
}
