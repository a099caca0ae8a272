package test

import (
	"context"
	"fmt"
	"testing"

	"github.com/leasefence/leasefence/fence/sqlfence"
)

// BenchmarkUpdate compares a fenced update of one row with a plain UPDATE of
// the same row, on each backend, in the same run.
func BenchmarkUpdate(b *testing.B) {
	for _, be := range backends() {
		b.Run("db="+be.name, func(b *testing.B) {
			db, f, table := setup(b, be)
			ctx := context.Background()
			if err := f.Upsert(ctx, db, "row", 1, sqlfence.Set("payload", "v")); err != nil {
				b.Fatal(err)
			}
			plain := fmt.Sprintf("UPDATE %s SET payload = ? WHERE id = ?", table)
			if be.dialect == sqlfence.Postgres {
				plain = fmt.Sprintf("UPDATE %s SET payload = $1 WHERE id = $2", table)
			}
			b.Run("impl=plain", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if _, err := db.ExecContext(ctx, plain, "v", "row"); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("impl=fenced", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if err := f.Update(ctx, db, "row", 1, sqlfence.Set("payload", "v")); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
