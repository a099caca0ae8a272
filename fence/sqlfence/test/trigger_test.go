package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// TestTriggerRefusesLowering installs the trigger (twice) and checks that
// a hand-written UPDATE that lowers the token is refused by the database
// itself, that one that raises it passes, and that the fence's own writes
// and claims keep working and keep reporting stale tokens as such.
func TestTriggerRefusesLowering(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, table := setup(t, b)
			ctx := context.Background()
			for round := 0; round < 2; round++ {
				for _, stmt := range f.TriggerDDL() {
					if _, err := db.ExecContext(ctx, stmt); err != nil {
						t.Fatalf("round %d: %s: %v", round, stmt, err)
					}
				}
			}
			if err := f.Upsert(ctx, db, "a", 10, sqlfence.Set("payload", "ten")); err != nil {
				t.Fatal(err)
			}
			handWrittenLowering(ctx, t, db, f, table)
			handWrittenRaising(ctx, t, db, table)
			fencedBesideTrigger(ctx, t, db, f, table)
		})
	}
}

// handWrittenLowering: an UPDATE that lowers row "a" from 10 to 3 without
// the fence is refused by the trigger, and TriggerRefusal reads it.
func handWrittenLowering(ctx context.Context, t *testing.T, db *sql.DB, f *sqlfence.Fence, table string) {
	t.Helper()
	_, err := db.ExecContext(ctx, fmt.Sprintf(`UPDATE %s SET payload = 'admin', fence_token = 3 WHERE id = 'a'`, table))
	if err == nil {
		t.Fatal("a hand-written UPDATE lowered the token")
	}
	stale := f.TriggerRefusal(err, "a")
	if stale == nil || !errors.Is(stale, fence.ErrStale) || stale.Token != 3 || stale.Highest != 10 {
		t.Fatalf("TriggerRefusal(%v) = %v, want a StaleError 3 below 10", err, stale)
	}
	if p, tok := payload(t, db, table, "a"); p != "ten" || tok != 10 {
		t.Fatalf("row = %q@%d after the refused UPDATE, want ten@10", p, tok)
	}
	if f.TriggerRefusal(errors.New("some other error"), "a") != nil {
		t.Fatal("TriggerRefusal took another error for a refusal")
	}
}

// handWrittenRaising: the trigger lets through hand-written updates that
// keep the token or raise it (to 12).
func handWrittenRaising(ctx context.Context, t *testing.T, db *sql.DB, table string) {
	t.Helper()
	for _, stmt := range []string{
		fmt.Sprintf(`UPDATE %s SET payload = 'same' WHERE id = 'a'`, table),
		fmt.Sprintf(`UPDATE %s SET payload = 'admin', fence_token = 12 WHERE id = 'a'`, table),
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if p, tok := payload(t, db, table, "a"); p != "admin" || tok != 12 {
		t.Fatalf("row = %q@%d, want admin@12", p, tok)
	}
}

// fencedBesideTrigger: with the trigger in place, the fence's own writes
// and claims on row "a" (at 12) pass when they keep or raise the token,
// and lower ones are refused as stale by the fence, not failed by the
// trigger.
func fencedBesideTrigger(ctx context.Context, t *testing.T, db *sql.DB, f *sqlfence.Fence, table string) {
	t.Helper()
	if err := f.Update(ctx, db, "a", 13, sqlfence.Set("payload", "thirteen")); err != nil {
		t.Fatalf("fenced Update: %v", err)
	}
	for _, tok := range []int64{13, 14} {
		if err := f.Claim(ctx, db, "a", tok); err != nil {
			t.Fatalf("claim with token %d: %v", tok, err)
		}
	}
	for _, write := range []func() error{
		func() error { return f.Update(ctx, db, "a", 11, sqlfence.Set("payload", "stale")) },
		func() error { return f.Upsert(ctx, db, "a", 11, sqlfence.Set("payload", "stale")) },
		func() error { return f.Claim(ctx, db, "a", 11) },
	} {
		var se *fence.StaleError
		if err := write(); !errors.As(err, &se) || se.Highest != 14 || se.Token != 11 {
			t.Fatalf("stale fenced write: %v, want StaleError 11 < 14", err)
		}
	}
	if p, tok := payload(t, db, table, "a"); p != "thirteen" || tok != 14 {
		t.Fatalf("row = %q@%d, want thirteen@14", p, tok)
	}
}

// TestSchemaQualifiedTable: "main.t" and "public.t" name a table in a
// schema, each part quoted, for every statement the fence writes.
func TestSchemaQualifiedTable(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			schema := map[sqlfence.Dialect]string{sqlfence.SQLite: "main", sqlfence.Postgres: "public"}[b.dialect]
			name := fmt.Sprintf("ckq_%d", os.Getpid())
			ctx := context.Background()
			f, err := sqlfence.New(b.dialect, schema+"."+name, "id")
			if err != nil {
				t.Fatal(err)
			}
			qualified := fmt.Sprintf(`"%s"."%s"`, schema, name)
			if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (id TEXT PRIMARY KEY, payload TEXT, %s)`, qualified, f.ColumnDDL())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.ExecContext(context.Background(), "DROP TABLE "+qualified) })
			for _, stmt := range f.TriggerDDL() {
				if _, err := db.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			if err := f.Upsert(ctx, db, "a", 5, sqlfence.Set("payload", "five")); err != nil {
				t.Fatalf("Upsert: %v", err)
			}
			if err := f.Upsert(ctx, db, "a", 6, sqlfence.Set("payload", "six")); err != nil {
				t.Fatalf("second Upsert: %v", err)
			}
			if err := f.Update(ctx, db, "a", 4, sqlfence.Set("payload", "four")); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("stale Update: %v, want ErrStale", err)
			}
			if h, err := f.Highest(ctx, db, "a"); err != nil || h != 6 {
				t.Fatalf("Highest = %d, %v; want 6", h, err)
			}
		})
	}
}

// TestBadColumns: writes that set the id or fence column, or a column
// twice, and names with too many dots, are refused before anything is sent.
func TestBadColumns(t *testing.T) {
	etcdproc.LeakCheck(t)
	if _, err := sqlfence.New(sqlfence.SQLite, "a.b.c", "id"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("table a.b.c: %v", err)
	}
	if _, err := sqlfence.New(sqlfence.SQLite, "t", "id", nil); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("nil Option: %v", err)
	}
	if _, err := sqlfence.New(sqlfence.SQLite, "t", "tok", sqlfence.WithTokenColumn("tok")); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("fence column = id column: %v", err)
	}
	db, f, table := setup(t, backends()[0])
	ctx := context.Background()
	if err := f.Upsert(ctx, db, "a", 3, sqlfence.Set("payload", "ok")); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]sqlfence.Col{
		"id column":    {sqlfence.Set("id", "b")},
		"fence column": {sqlfence.Set("fence_token", 99)},
		"twice":        {sqlfence.Set("payload", "x"), sqlfence.Set("payload", "y")},
	}
	for what, cols := range cases {
		for _, err := range []error{f.Update(ctx, db, "a", 4, cols...), f.Upsert(ctx, db, "a", 4, cols...)} {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Errorf("%s: %v, want ErrInvalidArgument", what, err)
			}
			if err != nil && strings.Count(err.Error(), "sqlfence:") != 1 {
				t.Errorf("%s: %q names the package more than once", what, err)
			}
		}
	}
	if p, tok := payload(t, db, table, "a"); p != "ok" || tok != 3 {
		t.Fatalf("bad input changed the row: %q@%d", p, tok)
	}
}
