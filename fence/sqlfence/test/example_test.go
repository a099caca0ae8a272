package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
)

// A new holder of a shard's lock resumes with a claim and a read in one
// transaction: the write its predecessor still had in flight can no longer
// land after the read.
func Example_claim() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "claim")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "offsets.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	f, err := sqlfence.New(sqlfence.SQLite, "offsets", "shard")
	if err != nil {
		log.Fatal(err)
	}
	// The other columns have defaults: a claim of a missing row creates it
	// with its id and token only.
	ddl := `CREATE TABLE offsets (shard TEXT PRIMARY KEY, "offset" BIGINT NOT NULL DEFAULT 0, ` + f.ColumnDDL() + `)`
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		log.Fatal(err)
	}
	// The previous holder, token 3, committed offset 10.
	if err := f.Upsert(ctx, db, "shard-7", 3, sqlfence.Set("offset", 10)); err != nil {
		log.Fatal(err)
	}

	// The new holder, token 6: claim, then read, then commit.
	resume := func(token int64) (int64, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		if err := f.Claim(ctx, tx, "shard-7", token); err != nil {
			return 0, err // a *fence.StaleError if a newer holder has claimed
		}
		var offset int64
		if err := tx.QueryRowContext(ctx, `SELECT "offset" FROM offsets WHERE shard = ?`, "shard-7").Scan(&offset); err != nil {
			return 0, err
		}
		return offset, tx.Commit()
	}
	offset, err := resume(6)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("token 6 resumes after offset", offset)

	// The previous holder's late commit is refused: it cannot move the
	// offset under the new holder, who has not written yet.
	err = f.Upsert(ctx, db, "shard-7", 3, sqlfence.Set("offset", 20))
	fmt.Println("late commit of token 3:", err)
	fmt.Println("stale:", errors.Is(err, fence.ErrStale))
	// Output:
	// token 6 resumes after offset 10
	// late commit of token 3: fence: stale token 3 at "offsets/shard-7": token 6 already accepted
	// stale: true
}
