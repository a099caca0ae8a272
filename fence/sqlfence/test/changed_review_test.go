package test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

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
func TestReviewClaimRowInsertedMeanwhile(t *testing.T) {
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
