package sqlfence

import (
	"context"
	"errors"
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
// For a row that exists it is one statement:
//
//	UPDATE t SET fence_token = ? WHERE t.id = ? AND t.fence_token <= ?
//
// A missing row is created by a second one, with only its id and fence
// column set (its other columns take their defaults):
//
//	INSERT INTO t (id, fence_token) VALUES (?, ?)
//	ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token
//	WHERE t.fence_token <= excluded.fence_token
//
// An equal token passes, and a higher one recorded in the row refuses the
// claim with a *fence.StaleError (errors.Is fence.ErrStale) naming both
// tokens, having changed nothing. On PostgreSQL the claim of a row that
// exists also locks it until the claim's transaction ends: a lower write
// on another connection waits, and is refused once the claim commits (a
// lower Update of a row the claim is creating finds no row, ErrMissing;
// a lower Upsert waits and is refused).
//
// A missing row can only be created if every other column of the table
// has a default or accepts NULL; otherwise the claim fails with an error
// that says so: create the row first (Upsert), or give those columns
// defaults.
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
	ctx, done := f.begin(ctx, "claim", id, token)
	err := f.claim(ctx, ex, id, token)
	done(err)
	return err
}

// claim raises an existing row's fence, and creates the row if it is
// missing. The INSERT is not the first statement: both databases check
// the NOT NULL columns of the row an INSERT would add before they find
// the existing one, so a table with such a column could never be claimed.
func (f *Fence) claim(ctx context.Context, ex Execer, id any, token int64) error {
	upd := fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s = %s AND %s <= %s",
		f.table, f.token, f.placeholder(1), f.col(f.id), f.placeholder(2), f.col(f.token), f.placeholder(3))
	err := f.exec(ctx, ex, stmt{op: "claim", q: upd, args: []any{token, id, token}, id: id, token: token, mayBeMissing: true})
	// ErrChanged here is a row the UPDATE did not see (another
	// transaction was inserting it) that holds a lower token by the time
	// it is read: as for a missing row, the INSERT decides.
	if !errors.Is(err, ErrMissing) && !errors.Is(err, ErrChanged) {
		return err
	}
	ins := fmt.Sprintf("INSERT INTO %s (%s, %s) VALUES (%s, %s) ON CONFLICT (%s) DO UPDATE SET %s = excluded.%s WHERE %s",
		f.table, f.id, f.token, f.placeholder(1), f.placeholder(2), f.id, f.token, f.token, f.raises())
	return f.exec(ctx, ex, stmt{op: "claim", q: ins, args: []any{id, token}, id: id, token: token})
}
