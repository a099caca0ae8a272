package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// readOffset is a plain read of the shard's offset, on a *sql.DB or in a
// transaction.
func readOffset(ctx context.Context, q sqlfence.Execer, table string) (int64, error) {
	var off int64
	err := q.QueryRowContext(ctx, fmt.Sprintf(`SELECT off FROM %s WHERE id = 'shard'`, table)).Scan(&off)
	return off, err
}

// claimAndRead is how a holding resumes with a claim: the claim, then the
// read, in one transaction.
func claimAndRead(ctx context.Context, db *sql.DB, f *sqlfence.Fence, table string, token int64) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := f.Claim(ctx, tx, "shard", token); err != nil {
		return 0, err
	}
	off, err := readOffset(ctx, tx, table)
	if err != nil {
		return 0, err
	}
	return off, tx.Commit()
}

// resumeFunc is how B resumes its holding: it returns the offset read.
type resumeFunc func(ctx context.Context, db *sql.DB, f *sqlfence.Fence, table string) (int64, error)

// The gap a claim closes, step by step with plain tokens:
//  1. A holds the shard with token 3 and has committed offset 10; it is
//     paused, its commit of offset 20 in flight.
//  2. B takes the lock (token 6) and resumes: it reads offset 10.
//  3. A's late commit of 20 arrives.
//  4. B commits 11 with token 6.
//
// With a plain read in step 2 the row's fence still says 3, A's late
// commit is accepted, and the offset goes 20 -> 11 although every write
// was fenced. With a claim in the read's transaction, A's late commit is
// refused and the offset never moves back.
func TestClaimClosesReadGap(t *testing.T) {
	etcdproc.LeakCheck(t)
	const tokenA, tokenB = 3, 6
	resumes := []struct {
		name   string
		resume resumeFunc
		gap    bool // the plain read leaves the gap open
	}{
		{"plain read", func(ctx context.Context, db *sql.DB, _ *sqlfence.Fence, table string) (int64, error) {
			return readOffset(ctx, db, table)
		}, true},
		{"claim and read", func(ctx context.Context, db *sql.DB, f *sqlfence.Fence, table string) (int64, error) {
			return claimAndRead(ctx, db, f, table, tokenB)
		}, false},
	}
	for _, b := range backends() {
		for _, r := range resumes {
			t.Run(b.name+"/"+r.name, func(t *testing.T) {
				history, late := gapScenario(t, b, tokenA, tokenB, r.resume)
				t.Logf("offsets after each step: %v; A's late commit: %v", history, late)
				backwards := !slices.IsSorted(history)
				if r.gap {
					if late != nil || !backwards || !slices.Equal(history, []int64{10, 10, 20, 11}) {
						t.Fatalf("plain read: late commit %v, offsets %v; want it accepted and 10 10 20 11 (the gap)", late, history)
					}
					return
				}
				var se *fence.StaleError
				if !errors.As(late, &se) || se.Token != tokenA || se.Highest != tokenB {
					t.Fatalf("A's late commit after B's claim: %v, want a StaleError %d < %d", late, tokenA, tokenB)
				}
				if backwards || !slices.Equal(history, []int64{10, 10, 10, 11}) {
					t.Fatalf("offsets %v after a claim, want 10 10 10 11", history)
				}
			})
		}
	}
}

// gapScenario runs the four steps, B resuming with resume, and returns
// the offset after each step and the verdict on A's late commit.
func gapScenario(t *testing.T, b backend, tokenA, tokenB int64, resume resumeFunc) (history []int64, late error) {
	t.Helper()
	db, f, table := newTable(t, b, "off BIGINT", true)
	ctx := context.Background()
	step := func() {
		off, err := readOffset(ctx, db, table)
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, off)
	}
	if err := f.Upsert(ctx, db, "shard", tokenA, sqlfence.Set("off", 10)); err != nil {
		t.Fatal(err)
	}
	step()
	from, err := resume(ctx, db, f, table)
	if err != nil || from != 10 {
		t.Fatalf("B resumed from %d, %v; want 10", from, err)
	}
	step()
	late = f.Upsert(ctx, db, "shard", tokenA, sqlfence.Set("off", 20))
	step()
	if err := f.Upsert(ctx, db, "shard", tokenB, sqlfence.Set("off", from+1)); err != nil {
		t.Fatalf("B's commit of %d: %v", from+1, err)
	}
	step()
	return history, late
}

// row reads the row id's payload (NULL as "<null>") and fence token, and
// how many rows the table has.
func row(t *testing.T, db *sql.DB, table, id string) (string, int64, int) {
	t.Helper()
	var p sql.NullString
	var tok int64
	var n int
	err := db.QueryRow(fmt.Sprintf(`SELECT payload, fence_token, (SELECT count(*) FROM %s) FROM %s WHERE id = '%s'`, table, table, id)).Scan(&p, &tok, &n)
	if errors.Is(err, sql.ErrNoRows) {
		if err := db.QueryRow(fmt.Sprintf(`SELECT count(*) FROM %s`, table)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return "<missing>", 0, n
	}
	if err != nil {
		t.Fatal(err)
	}
	if !p.Valid {
		return "<null>", tok, n
	}
	return p.String, tok, n
}

// TestClaim: a claim creates a missing row with only its id and token,
// passes with an equal token, raises a lower one, and is refused by a
// higher one without changing anything; refusals reach the hooks, and
// writes below a claim are refused.
func TestClaim(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			var refused refusals
			db, f, table := newTable(t, b, "payload TEXT", true, sqlfence.WithHooks(refused.hooks()))
			ctx := context.Background()
			expect := func(what, id, p string, tok int64, rows int) {
				t.Helper()
				expectRow(t, db, table, what, id, p, tok, rows)
			}
			if err := f.Claim(ctx, db, "a", 4); err != nil {
				t.Fatalf("claim of a missing row: %v", err)
			}
			expect("claim of a missing row", "a", "<null>", 4, 1)
			if err := f.Claim(ctx, db, "a", 4); err != nil {
				t.Fatalf("claim with an equal token: %v", err)
			}
			expect("claim with an equal token", "a", "<null>", 4, 1)
			if err := f.Upsert(ctx, db, "a", 4, sqlfence.Set("payload", "four")); err != nil {
				t.Fatalf("the claimer's write: %v", err)
			}
			if err := f.Claim(ctx, db, "a", 7); err != nil {
				t.Fatalf("claim with a higher token: %v", err)
			}
			expect("claim with a higher token", "a", "four", 7, 1)
			err := f.Claim(ctx, db, "a", 5)
			var se *fence.StaleError
			if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || se.Token != 5 || se.Highest != 7 ||
				!strings.Contains(err.Error(), "token 5") || !strings.Contains(err.Error(), "token 7") {
				t.Fatalf("claim below the row's token: %v, want a StaleError naming 5 and 7", err)
			}
			expect("refused claim", "a", "four", 7, 1)
			if err := f.Update(ctx, db, "a", 6, sqlfence.Set("payload", "six")); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("write below the claim: %v, want ErrStale", err)
			}
			expect("write below the claim", "a", "four", 7, 1)
			if got := refused.list(); !slices.Equal(got, []string{"sql", "sql"}) {
				t.Fatalf("hooks saw refusals %v, want the refused claim's and write's", got)
			}
		})
	}
}

// refusals records the refusals hooks report.
type refusals struct {
	mu     sync.Mutex
	guards []string
}

func (r *refusals) hooks() *fence.Hooks {
	return &fence.Hooks{Refused: func(g string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.guards = append(r.guards, g)
	}}
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.guards)
}

// expectRow fails the test unless row id has payload p and token tok, in
// a table of rows rows.
func expectRow(t *testing.T, db *sql.DB, table, what, id, p string, tok int64, rows int) {
	t.Helper()
	if gp, gt, gn := row(t, db, table, id); gp != p || gt != tok || gn != rows {
		t.Fatalf("%s: row %s = %s@%d of %d rows, want %s@%d of %d", what, id, gp, gt, gn, p, tok, rows)
	}
}

// sendsNothing is an Execer that fails the test if anything is sent.
type sendsNothing struct{ t *testing.T }

func (s sendsNothing) ExecContext(_ context.Context, q string, _ ...any) (sql.Result, error) {
	s.t.Errorf("sent %q", q)
	return nil, errors.New("sendsNothing")
}

func (s sendsNothing) QueryRowContext(_ context.Context, q string, _ ...any) *sql.Row {
	s.t.Fatalf("sent %q", q)
	return nil
}

func TestClaimBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	f, err := sqlfence.New(sqlfence.SQLite, "t", "id")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		id    any
		token int64
	}{
		"zero token":     {"a", 0},
		"negative token": {"a", -1},
		"nil id":         {nil, 5},
	}
	for name, c := range cases {
		err := f.Claim(context.Background(), sendsNothing{t}, c.id, c.token)
		if !errors.Is(err, fence.ErrInvalidArgument) || strings.Count(err.Error(), "sqlfence:") != 1 {
			t.Errorf("%s: %v, want ErrInvalidArgument, the package named once", name, err)
		}
	}
}

// driverError tells whether err wraps the database driver's own error.
func driverError(err error) bool {
	var pg interface{ SQLState() string }
	var lite *sqlite.Error
	return errors.As(err, &pg) || errors.As(err, &lite)
}

// TestClaimNeedsDefaults: on a table with a NOT NULL column without a
// default, the claim of a missing row fails with an error that says what
// to do and changes nothing; the claim of a row that exists goes through.
func TestClaimNeedsDefaults(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, table := newTable(t, b, "payload TEXT NOT NULL", true)
			ctx := context.Background()
			if err := f.Upsert(ctx, db, "b", 2, sqlfence.Set("payload", "two")); err != nil {
				t.Fatal(err)
			}
			err := f.Claim(ctx, db, "a", 4)
			if err == nil || !strings.Contains(err.Error(), "the row is missing and the table has a NOT NULL column without a default") ||
				!strings.Contains(err.Error(), "create the row first (Upsert)") || !driverError(err) ||
				strings.Count(err.Error(), "sqlfence:") != 1 {
				t.Fatalf("claim of a missing row: %v, want the clear error wrapping the driver's", err)
			}
			if p, tok, n := row(t, db, table, "a"); p != "<missing>" || tok != 0 || n != 1 {
				t.Fatalf("the failed claim changed the table: a = %s@%d of %d rows", p, tok, n)
			}
			if err := f.Claim(ctx, db, "b", 4); err != nil {
				t.Fatalf("claim of an existing row: %v", err)
			}
			if p, tok, _ := row(t, db, table, "b"); p != "two" || tok != 4 {
				t.Fatalf("after the claim: b = %s@%d, want two@4", p, tok)
			}
		})
	}
}

// fenceOp is one statement of the fence, run on row "a".
type fenceOp struct {
	name string
	run  func(ctx context.Context, f *sqlfence.Fence, db *sql.DB) error
}

var fenceOps = []fenceOp{
	{"Highest", func(ctx context.Context, f *sqlfence.Fence, db *sql.DB) error {
		_, err := f.Highest(ctx, db, "a")
		return err
	}},
	{"Update", func(ctx context.Context, f *sqlfence.Fence, db *sql.DB) error {
		return f.Update(ctx, db, "a", 5, sqlfence.Set("payload", "x"))
	}},
	{"Upsert", func(ctx context.Context, f *sqlfence.Fence, db *sql.DB) error {
		return f.Upsert(ctx, db, "a", 5, sqlfence.Set("payload", "x"))
	}},
	{"Claim", func(ctx context.Context, f *sqlfence.Fence, db *sql.DB) error {
		return f.Claim(ctx, db, "a", 5)
	}},
}

// TestNoFenceColumn: every statement on a table without the fence column
// fails with an error that says so and names AddColumnDDL, wrapping the
// driver's, and changes nothing.
func TestNoFenceColumn(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		for _, column := range []string{sqlfence.DefaultTokenColumn, `fence "tok"`} {
			for _, op := range fenceOps {
				t.Run(fmt.Sprintf("%s/%s/%s", b.name, column, op.name), func(t *testing.T) {
					noFenceColumn(t, b, column, op)
				})
			}
		}
	}
}

func noFenceColumn(t *testing.T, b backend, column string, op fenceOp) {
	db, f, table := newTable(t, b, "payload TEXT", false, sqlfence.WithTokenColumn(column))
	ctx := context.Background()
	// A row, so that a read that took the column for a string would find
	// something to scan.
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (id, payload) VALUES ('a', 'p')`, table)); err != nil {
		t.Fatal(err)
	}
	err := op.run(ctx, f, db)
	want := fmt.Sprintf(`has no fence column %q: add it with AddColumnDDL: `, column)
	if err == nil || !strings.HasPrefix(err.Error(), "sqlfence: table ") || !strings.Contains(err.Error(), want) ||
		!driverError(err) || strings.Count(err.Error(), "sqlfence:") != 1 {
		t.Fatalf("%v, want sqlfence: table ... %s... wrapping the driver's error", err, want)
	}
	var p string
	var n int
	if err := db.QueryRow(fmt.Sprintf(`SELECT max(payload), count(*) FROM %s`, table)).Scan(&p, &n); err != nil || p != "p" || n != 1 {
		t.Fatalf("table now %q, %d rows (%v); want it unchanged", p, n, err)
	}
}

// TestOtherColumnMissing: a write naming a missing column that is not the
// fence column gets the driver's error, not the fence column's.
func TestOtherColumnMissing(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, _ := newTable(t, b, "payload TEXT", true)
			ctx := context.Background()
			for _, err := range []error{
				f.Update(ctx, db, "a", 5, sqlfence.Set("nope", 1)),
				f.Upsert(ctx, db, "a", 5, sqlfence.Set("nope", 1)),
			} {
				if err == nil || strings.Contains(err.Error(), "fence column") || !strings.Contains(err.Error(), "nope") || !driverError(err) {
					t.Fatalf("write of a missing column nope: %v, want the driver's error about nope", err)
				}
			}
		})
	}
}

// TestClaimLocksRow (PostgreSQL): a claim in an open transaction holds the
// row, so a lower Update in a transaction on a second connection waits
// for it. Once the claim commits, the Update is refused; had it rolled
// back, the Update goes through. The order comes from the claim's
// transaction boundary, not from timing.
func TestClaimLocksRow(t *testing.T) {
	etcdproc.LeakCheck(t)
	pg := backends()[1]
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			db, f, table := newTable(t, pg, "payload TEXT", true)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := f.Upsert(ctx, db, "a", 3, sqlfence.Set("payload", "three")); err != nil {
				t.Fatal(err)
			}
			tx, update := updateBehindClaim(ctx, t, db, f)
			if end == "rollback" {
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				if err := <-update; err != nil {
					t.Fatalf("Update after the claim rolled back: %v", err)
				}
				expectRow(t, db, table, "after the rollback", "a", "late", 3, 1)
				return
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			var se *fence.StaleError
			if err := <-update; !errors.As(err, &se) || se.Token != 3 || se.Highest != 6 {
				t.Fatalf("Update after the claim committed: %v, want a StaleError 3 < 6", err)
			}
			expectRow(t, db, table, "after the commit", "a", "three", 6, 1)
		})
	}
}

// updateBehindClaim claims row "a" with token 6 in a transaction it leaves
// open, starts an Update of it with token 3 in a transaction on another
// connection (committed if the Update passes), and returns once
// PostgreSQL shows that Update waiting for the claim's transaction,
// having checked that it has not returned.
func updateBehindClaim(ctx context.Context, t *testing.T, db *sql.DB, f *sqlfence.Fence) (*sql.Tx, <-chan error) {
	t.Helper()
	claimConn, claimPid := conn(ctx, t, db)
	writeConn, writePid := conn(ctx, t, db)
	tx, err := claimConn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if err := f.Claim(ctx, tx, "a", 6); err != nil {
		t.Fatalf("claim: %v", err)
	}
	writeTx, err := writeConn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writeTx.Rollback() })
	done := make(chan error, 1)
	go func() {
		err := f.Update(ctx, writeTx, "a", 3, sqlfence.Set("payload", "late"))
		if err == nil {
			err = writeTx.Commit()
		}
		done <- err
	}()
	awaitBlocked(ctx, t, db, writePid, claimPid)
	select {
	case err := <-done:
		t.Fatalf("the lower Update returned while the claim's transaction was open: %v", err)
	default:
	}
	return tx, done
}

// conn takes a connection of its own from the pool, and its backend's pid.
func conn(ctx context.Context, t *testing.T, db *sql.DB) (*sql.Conn, int) {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var pid int
	if err := c.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return c, pid
}

// awaitBlocked returns once PostgreSQL reports backend waiter blocked by
// backend holder. A lock wait has no event to subscribe to: this polls
// the server's own lock table until it shows the wait, and never guesses
// it from elapsed time.
func awaitBlocked(ctx context.Context, t *testing.T, db *sql.DB, waiter, holder int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var blocked bool
		err := db.QueryRowContext(ctx, `SELECT $2::int = ANY(pg_blocking_pids($1::int))`, waiter, holder).Scan(&blocked)
		if err != nil {
			t.Fatalf("waiting for backend %d to block on %d: %v", waiter, holder, err)
		}
		if blocked {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("backend %d never blocked on %d: %v", waiter, holder, ctx.Err())
		}
	}
}

// PostgreSQL: a claim that creates a missing row, in a transaction left
// open. A lower Upsert on another connection waits for it and is refused
// once it commits. A lower Update does not wait (the row it would lock is
// not visible to it yet): it reports ErrMissing at once and writes
// nothing, and once the claim commits it is refused as stale.
func TestClaimCreatingRowRefusesLowerWrites(t *testing.T) {
	etcdproc.LeakCheck(t)
	pg := backends()[1]
	db, f, table := newTable(t, pg, "payload TEXT", true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claimConn, claimPid := conn(ctx, t, db)
	writeConn, writePid := conn(ctx, t, db)
	tx, err := claimConn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := f.Claim(ctx, tx, "a", 6); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := f.Update(ctx, writeConn, "a", 3, sqlfence.Set("payload", "late")); !errors.Is(err, sqlfence.ErrMissing) {
		t.Fatalf("lower Update beside an uncommitted claim that created the row: %v, want ErrMissing", err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Upsert(ctx, writeConn, "a", 3, sqlfence.Set("payload", "late")) }()
	awaitBlocked(ctx, t, db, writePid, claimPid)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var se *fence.StaleError
	if err := <-done; !errors.As(err, &se) || se.Highest != 6 || se.Token != 3 {
		t.Fatalf("lower Upsert after the claim committed: %v, want a StaleError 3 < 6", err)
	}
	if err := f.Update(ctx, writeConn, "a", 3, sqlfence.Set("payload", "late")); !errors.As(err, &se) {
		t.Fatalf("lower Update after the claim committed: %v, want a StaleError", err)
	}
	expectRow(t, db, table, "after the claim", "a", "<null>", 6, 1)
}

// afterFirstExec runs then once, right after the first statement sent
// through it returns: an interleaving point between a claim's UPDATE and
// its read-back of the row.
type afterFirstExec struct {
	sqlfence.Execer
	then func()
	done bool
}

func (a *afterFirstExec) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	res, err := a.Execer.ExecContext(ctx, q, args...)
	if !a.done {
		a.done = true
		a.then()
	}
	return res, err
}

// PostgreSQL, READ COMMITTED: a claim with token 4 on a row that another
// transaction (a claim with token 1) is creating. The claim's UPDATE does
// not see the uncommitted row and changes nothing; the other transaction
// commits; the read-back then finds the row with token 1. No higher token
// was ever recorded, so the claim must go on and raise the row to 4, not
// stop at ErrChanged ("refused by a higher token", which Claim's doc does
// not list) and leave the row at 1, as it once did.
func TestClaimRaisesRowInsertedMeanwhile(t *testing.T) {
	etcdproc.LeakCheck(t)
	pg := backends()[1]
	db, f, table := newTable(t, pg, "payload TEXT", true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if err := f.Claim(ctx, other, "a", 1); err != nil {
		t.Fatal(err)
	}
	ex := &afterFirstExec{Execer: db, then: func() {
		if err := other.Commit(); err != nil {
			t.Errorf("commit of the other claim: %v", err)
		}
	}}
	err = f.Claim(ctx, ex, "a", 4)
	t.Logf("claim: %v", err)
	if errors.Is(err, sqlfence.ErrChanged) {
		t.Errorf("claim with token 4 over a row created with token 1: %v (no higher token ever refused it)", err)
	} else if err != nil && !errors.Is(err, fence.ErrStale) {
		t.Errorf("claim: %v", err)
	}
	expectRow(t, db, table, "after the claim", "a", "<null>", 4, 1)
}
