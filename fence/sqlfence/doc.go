// Package sqlfence fences writes to rows of a SQL database with lock
// tokens, through database/sql with any driver (PostgreSQL and SQLite
// placeholders are supported).
//
// The protected row carries the highest token it has accepted, in a fence
// column (see Fence.ColumnDDL and Fence.AddColumnDDL). Every write is one
// statement that checks and records the token in the same atomic step as
// the change:
//
//	UPDATE t SET ..., fence_token = $token WHERE t.id = $id AND t.fence_token <= $token
//
// and a write that changed no row is told apart as stale (a
// *fence.StaleError with the row's highest token) or missing (ErrMissing).
// Upsert makes the first write insert the row.
//
// # Resuming a holding: Claim
//
// A new holder of the lock that reads the row before it writes must first
// claim the row with its token (Fence.Claim), in the transaction of that
// read, and read after the claim. Without the claim, the row still
// accepts the previous holder's token until the new holder's first write,
// so a commit the previous holder had in flight can land after the new
// holder's read, and the new holder then builds on a state that changed
// under it (an offset that goes back, say). From the claim on, no lower
// token writes the row. A claim with the token the row already has
// passes; a claim refused with a *fence.StaleError changes nothing and
// tells the holder that a newer one has taken over.
//
// A claim of a row that exists works on any table. A claim of a missing
// row creates it with only its id and token, so it needs the table's
// other columns to have defaults (or accept NULL); otherwise it fails with
// an error that says so: create the row first, with Upsert, or give those
// columns defaults.
//
// On PostgreSQL a lower write that reaches the row while the claim's
// transaction is still open waits for that transaction, and is refused
// once it commits; if it rolls back, the claim is undone and the write
// goes through. (A lower Update of a row that the open claim is creating
// does not wait: it finds no row, ErrMissing.)
//
// Guaranteed: a write whose token is lower than one the row has accepted
// or claimed never lands, whatever happened to the lock in between,
// provided every writer of the row goes through the fence (a plain UPDATE
// that skips the column can still move the row). An equal token passes:
// one holder may write, and claim, many times. Not guaranteed: tokens of
// different lock names are unrelated, so a row must be fenced by one lock
// name only; and the highest token reported in a StaleError is read after
// the refusal, so it may be newer than the one that refused the write.
//
// A table without the fence column gets an error that says so and names
// AddColumnDDL, from every statement.
package sqlfence
