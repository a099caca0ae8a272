package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/sqlfence"
)

// Commit a shard's offset only if no newer holder of the shard lock has.
func Example() {
	ctx := context.Background()
	var db *sql.DB  // opened elsewhere
	var token int64 // lock.Token() of the shard's lock
	f, err := sqlfence.New(sqlfence.Postgres, "offsets", "shard")
	if err != nil {
		log.Fatal(err)
	}
	// Once: CREATE TABLE offsets (shard TEXT PRIMARY KEY, "offset" BIGINT, ...)
	// and then db.ExecContext(ctx, f.AddColumnDDL()).
	err = f.Upsert(ctx, db, "shard-7", token, sqlfence.Set("offset", 4096))
	if errors.Is(err, fence.ErrStale) {
		log.Print("a newer holder owns the shard; stop")
	}
}
