// Package sqlfence fences writes to rows of a SQL database with lock
// tokens, through database/sql with any driver (PostgreSQL and SQLite
// placeholders are supported).
//
// The protected row carries the highest token it has accepted, in a fence
// column (see Fence.ColumnDDL and Fence.AddColumnDDL). Every write is one
// statement that checks and records the token in the same atomic step as
// the change:
//
//	UPDATE t SET ..., fence_token = $token WHERE id = $id AND fence_token <= $token
//
// and a write that changed no row is told apart as stale (a
// *fence.StaleError with the row's highest token) or missing (ErrMissing).
// Upsert makes the first write insert the row.
//
// Guaranteed: a write whose token is lower than one the row has accepted
// never lands, whatever happened to the lock in between, provided every
// writer of the row goes through the fence (a plain UPDATE that skips the
// column can still move the row). An equal token passes: one holder may
// write many times. Not guaranteed: tokens of different lock names are
// unrelated, so a row must be fenced by one lock name only; and the highest
// token reported in a StaleError is read after the refusal, so it may be
// newer than the one that refused the write.
package sqlfence
