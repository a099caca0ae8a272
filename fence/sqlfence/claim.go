package sqlfence

import (
	"context"
	"fmt"
)

// Claim raises the fence column of the row id to token, so that from then
// on no lower token writes the row: the first step of a new holding,
// before it reads the row. Run it on the *sql.Tx of that read and read in
// the same transaction after it (on a *sql.DB it stands alone). A plain
// read at the start of a holding is not enough: until the new holder's
// first write raises the fence, a write the previous holder still had in
// flight passes it and can land after the read. The new holder then
// builds on a state that has changed under it.
//
// It is one statement, the same on PostgreSQL and SQLite but for the
// placeholders:
//
//	INSERT INTO t (id, fence_token) VALUES (?, ?)
//	ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token
//	WHERE t.fence_token <= excluded.fence_token
//
// A missing row is created with only its id and fence column set; its
// other columns take their defaults. An equal token passes, and a higher
// one recorded in the row refuses the claim with a *fence.StaleError
// (errors.Is fence.ErrStale) naming both tokens, having changed nothing.
// On PostgreSQL the claim also locks the row until its transaction ends: a
// lower write on another connection waits, and is refused once the claim
// commits.
//
// Every other column of the table must have a default or accept NULL.
// Both databases check the NOT NULL constraints of the row a claim would
// insert before they look for the existing row, so on a table with a NOT
// NULL column without a default every claim fails, even of a row that
// exists, with an error that says so; give such columns defaults.
//
// Bad input (a token <= 0, a nil id) gives an error wrapping
// fence.ErrInvalidArgument before anything is sent.
func (f *Fence) Claim(ctx context.Context, ex Execer, id any, token int64) error {
	if err := f.check(token, nil); err != nil {
		return err
	}
	if id == nil {
		// SQLite lets a primary key of a rowid table be NULL: a nil id
		// would claim a row nobody can name.
		return invalid("nil id")
	}
	q := fmt.Sprintf("INSERT INTO %s (%s, %s) VALUES (%s, %s) ON CONFLICT (%s) DO UPDATE SET %s = excluded.%s WHERE %s",
		f.table, f.id, f.token, f.placeholder(1), f.placeholder(2), f.id, f.token, f.token, f.raises())
	return f.result(ctx, ex, stmt{op: "claim", q: q, args: []any{id, token}, id: id, token: token})
}
