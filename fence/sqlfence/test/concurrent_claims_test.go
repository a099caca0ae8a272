package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// sqlOp is one fenced transaction of TestClaimsAndWritesConcurrent.
type sqlOp struct {
	kind  string
	token int64
	err   error
}

// Concurrent claims (committed and rolled back), Upserts and Updates with
// slowly rising, overlapping tokens on one row that starts missing. Each
// transaction that passes the fence appends its token to a log table in
// the same transaction, while it holds the row: in log order the tokens
// never go down (no lower write lands after a committed claim or write),
// each claim read the payload of the last logged write before it, and
// every refusal is a StaleError naming a higher token (or ErrMissing for
// an Update of a row not there yet, or ErrChanged, which writes nothing).
func TestClaimsAndWritesConcurrent(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, f, table := newTable(t, b, "payload TEXT", true)
			logT := fmt.Sprintf(`"claim log %p"`, t)
			ddl := `CREATE TABLE %s (seq INTEGER PRIMARY KEY AUTOINCREMENT, tok BIGINT NOT NULL, kind TEXT NOT NULL, val TEXT)`
			if b.dialect == sqlfence.Postgres {
				ddl = `CREATE TABLE %s (seq BIGSERIAL PRIMARY KEY, tok BIGINT NOT NULL, kind TEXT NOT NULL, val TEXT)`
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := db.ExecContext(ctx, fmt.Sprintf(ddl, logT)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.ExecContext(context.Background(), "DROP TABLE "+logT) })
			ph := func(n int) string {
				if b.dialect == sqlfence.Postgres {
					return fmt.Sprintf("$%d", n)
				}
				return "?"
			}
			logIns := fmt.Sprintf(`INSERT INTO %s (tok, kind, val) VALUES (%s, %s, %s)`, logT, ph(1), ph(2), ph(3))
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			const workers, opsEach = 4, 20
			ops := make([][]sqlOp, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, uint64(w)))
					for i := range opsEach {
						tok := 1 + int64(i/3) + r.Int64N(4)
						kind := []string{"claim", "claim", "claim-rollback", "upsert", "update"}[r.IntN(5)]
						val := fmt.Sprintf("w%d-%d", w, i)
						err := sqlStep(ctx, db, f, table, logIns, kind, tok, val)
						ops[w] = append(ops[w], sqlOp{kind: kind, token: tok, err: err})
					}
				}()
			}
			wg.Wait()
			n := sqlOutcomes(t, ops)
			t.Logf("outcomes: %v", n)
			checkSQLLog(ctx, t, db, f, logT)
		})
	}
}

// sqlOutcomes counts the outcomes of TestClaimsAndWritesConcurrent's
// transactions by kind, and fails the test on any it does not allow.
func sqlOutcomes(t *testing.T, ops [][]sqlOp) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, w := range ops {
		for _, op := range w {
			var se *fence.StaleError
			switch {
			case op.err == nil:
				n[op.kind]++
			case errors.As(op.err, &se) && se.Token == op.token && se.Highest > op.token:
				n[op.kind+" stale"]++
			case op.kind == "update" && errors.Is(op.err, sqlfence.ErrMissing):
				n[op.kind+" missing"]++
			case errors.Is(op.err, sqlfence.ErrChanged):
				// PostgreSQL: the row was inserted by another
				// transaction between the UPDATE's snapshot and the
				// read-back. Nothing was written, but no higher token
				// refused it either: see
				// TestClaimRaisesRowInsertedMeanwhile.
				n[op.kind+" changed"]++
			default:
				t.Errorf("%s with token %d: %v", op.kind, op.token, op.err)
			}
		}
	}
	return n
}

func sqlStep(ctx context.Context, db *sql.DB, f *sqlfence.Fence, table, logIns, kind string, tok int64, val string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	switch kind {
	case "claim", "claim-rollback":
		if err := f.Claim(ctx, tx, "row", tok); err != nil {
			return err
		}
		var p sql.NullString
		if err := tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT payload FROM %s WHERE id = 'row'`, table)).Scan(&p); err != nil {
			return err
		}
		val = p.String
		if kind == "claim-rollback" {
			return tx.Rollback()
		}
	case "upsert":
		err = f.Upsert(ctx, tx, "row", tok, sqlfence.Set("payload", val))
	case "update":
		err = f.Update(ctx, tx, "row", tok, sqlfence.Set("payload", val))
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, logIns, tok, kind, val); err != nil {
		return err
	}
	return tx.Commit()
}

func checkSQLLog(ctx context.Context, t *testing.T, db *sql.DB, f *sqlfence.Fence, logT string) {
	t.Helper()
	rows, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT seq, tok, kind, val FROM %s ORDER BY seq`, logT))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var highest int64
	payload := ""
	entries := 0
	for rows.Next() {
		var seq, tok int64
		var kind, val string
		if err := rows.Scan(&seq, &tok, &kind, &val); err != nil {
			t.Fatal(err)
		}
		entries++
		if tok < highest {
			t.Errorf("log %d: %s with token %d passed after token %d", seq, kind, tok, highest)
		}
		highest = max(highest, tok)
		switch kind {
		case "claim":
			if val != payload {
				t.Errorf("log %d: claim with token %d read %q, the last write put %q", seq, tok, val, payload)
			}
		default:
			payload = val
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if entries == 0 {
		t.Fatal("nothing passed the fence")
	}
	if got, err := f.Highest(ctx, db, "row"); err != nil || got != highest {
		t.Errorf("row's fence %d (%v), the log's highest token %d", got, err, highest)
	}
}
