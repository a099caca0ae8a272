package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/leasefence/leasefence/fence"
)

// DefaultTokenColumn is the fence column's name unless WithTokenColumn says
// otherwise.
const DefaultTokenColumn = "fence_token"

// Sentinel errors; match them with errors.Is.
var (
	// ErrMissing reports that Update found no row with the given id.
	ErrMissing = errors.New("sqlfence: row missing")

	// ErrChanged reports a write refused by a higher token that was gone
	// again when the row was read back (the row was deleted and inserted
	// anew meanwhile). Nothing was written.
	ErrChanged = errors.New("sqlfence: row changed during the write")
)

// Dialect is the SQL dialect a Fence writes: it decides placeholders.
type Dialect int

// The supported dialects.
const (
	// Postgres numbers placeholders $1, $2, ...
	Postgres Dialect = iota + 1
	// SQLite uses ? placeholders.
	SQLite
)

// Execer runs statements: *sql.DB, *sql.Tx and *sql.Conn all satisfy it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Col is one column set by a fenced write.
type Col struct {
	Name  string
	Value any
}

// Set names a column and the value a fenced write gives it.
func Set(name string, value any) Col { return Col{Name: name, Value: value} }

// Fence writes rows of one table, each guarded by the highest token the row
// has accepted. A Fence holds no connection or state besides its
// configuration, and is safe for concurrent use.
type Fence struct {
	dialect     Dialect
	schema      string // quoted, empty if the table name has no schema
	bare        string // the table's own name, quoted
	table       string // quoted, schema-qualified if given so
	id          string // quoted
	token       string // quoted
	rawTable    string
	idColumn    string
	tokenColumn string
	hooks       *fence.Hooks
}

// Option configures a Fence. New refuses a nil one.
type Option func(*Fence) error

// WithTokenColumn names the fence column (default "fence_token").
func WithTokenColumn(name string) Option {
	return func(f *Fence) error {
		q, err := quote(name)
		if err != nil {
			return err
		}
		f.token, f.tokenColumn = q, name
		return nil
	}
}

// WithHooks reports refused writes ("sql") and unknown outcomes to h, and
// each write and claim to its Write hook (guard kind "row" or "claim", key
// table/id).
func WithHooks(h *fence.Hooks) Option {
	return func(f *Fence) error {
		f.hooks = h
		return nil
	}
}

// New returns a Fence for table, whose primary key (or unique) column is
// idColumn. A table name with one dot is schema-qualified ("public.ckpt",
// "main.ckpt"); more dots are refused. Identifiers are quoted, each part on
// its own, never pasted into SQL as they are. Bad input gives an error
// wrapping fence.ErrInvalidArgument.
func New(dialect Dialect, table, idColumn string, opts ...Option) (*Fence, error) {
	if dialect != Postgres && dialect != SQLite {
		return nil, invalid("unknown dialect %d", dialect)
	}
	f := &Fence{dialect: dialect, rawTable: table, idColumn: idColumn, tokenColumn: DefaultTokenColumn}
	if err := f.setTable(table); err != nil {
		return nil, err
	}
	var err error
	if f.id, err = quote(idColumn); err != nil {
		return nil, err
	}
	f.token, _ = quote(DefaultTokenColumn)
	for _, opt := range opts {
		if opt == nil {
			return nil, invalid("nil Option")
		}
		if err := opt(f); err != nil {
			return nil, err
		}
	}
	if f.tokenColumn == f.idColumn {
		return nil, invalid("the fence column %q is the id column", f.tokenColumn)
	}
	return f, nil
}

// setTable quotes a table name, schema-qualified or not.
func (f *Fence) setTable(table string) error {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return invalid("table %q: at most one dot, between schema and table", table)
	}
	var err error
	if f.bare, err = quote(parts[len(parts)-1]); err != nil {
		return err
	}
	f.table = f.bare
	if len(parts) == 2 {
		if f.schema, err = quote(parts[0]); err != nil {
			return err
		}
		f.table = f.schema + "." + f.bare
	}
	return nil
}

// invalid is the error for bad input: it wraps fence.ErrInvalidArgument.
func invalid(format string, args ...any) error {
	return fmt.Errorf("sqlfence: %w: %s", fence.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// quote makes an identifier safe to put in SQL: double quotes, with inner
// quotes doubled, as both PostgreSQL and SQLite read them.
func quote(ident string) (string, error) {
	if ident == "" || strings.ContainsRune(ident, 0) {
		return "", invalid("identifier %q", ident)
	}
	return `"` + strings.ReplaceAll(ident, `"`, `""`) + `"`, nil
}

// AddColumnDDL is the statement that adds the fence column to an existing
// table. Existing rows start at token 0, which any real token passes.
func (f *Fence) AddColumnDDL() string {
	return fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s BIGINT NOT NULL DEFAULT 0", f.table, f.token)
}

// ColumnDDL is the fence column's definition, for a CREATE TABLE.
func (f *Fence) ColumnDDL() string {
	return f.token + " BIGINT NOT NULL DEFAULT 0"
}

func (f *Fence) placeholder(n int) string {
	if f.dialect == Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// Update sets cols on the row id if token is at least the row's fence
// token, and records token, in one statement:
//
//	UPDATE t SET c = ?, fence_token = ? WHERE t.id = ? AND t.fence_token <= ?
//
// It returns a *fence.StaleError (errors.Is fence.ErrStale) with the row's
// highest token if the row has accepted a higher one, and ErrMissing if
// there is no such row. Run it on a *sql.Tx to make it part of the
// caller's transaction.
func (f *Fence) Update(ctx context.Context, db Execer, id any, token int64, cols ...Col) error {
	if err := f.check(token, cols); err != nil {
		return err
	}
	var sets []string
	var args []any
	for _, c := range cols {
		q, _ := quote(c.Name)
		args = append(args, c.Value)
		sets = append(sets, q+" = "+f.placeholder(len(args)))
	}
	args = append(args, token)
	sets = append(sets, f.token+" = "+f.placeholder(len(args)))
	args = append(args, id)
	where := f.col(f.id) + " = " + f.placeholder(len(args))
	args = append(args, token)
	where += " AND " + f.col(f.token) + " <= " + f.placeholder(len(args))
	q := fmt.Sprintf("UPDATE %s SET %s WHERE %s", f.table, strings.Join(sets, ", "), where)
	return f.result(ctx, db, stmt{op: "write", q: q, args: args, id: id, token: token, mayBeMissing: true})
}

// Upsert is Update that inserts the row if it does not exist yet (the
// first write), with INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE
// fence_token <= token: still one statement.
func (f *Fence) Upsert(ctx context.Context, db Execer, id any, token int64, cols ...Col) error {
	if err := f.check(token, cols); err != nil {
		return err
	}
	names := []string{f.id}
	args := []any{id}
	var sets []string
	for _, c := range cols {
		q, _ := quote(c.Name)
		names = append(names, q)
		args = append(args, c.Value)
		sets = append(sets, q+" = excluded."+q)
	}
	names = append(names, f.token)
	args = append(args, token)
	sets = append(sets, f.token+" = excluded."+f.token)
	ph := make([]string, len(args))
	for i := range args {
		ph[i] = f.placeholder(i + 1)
	}
	q := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s WHERE %s",
		f.table, strings.Join(names, ", "), strings.Join(ph, ", "), f.id, strings.Join(sets, ", "), f.raises())
	return f.result(ctx, db, stmt{op: "write", q: q, args: args, id: id, token: token})
}

// raises is the condition of an INSERT ... ON CONFLICT DO UPDATE that lets
// the update through only if it does not lower the fence.
func (f *Fence) raises() string {
	return fmt.Sprintf("%s <= excluded.%s", f.col(f.token), f.token)
}

// col qualifies a column with the table's name. SQLite reads a bare
// double-quoted name that matches no column as a string literal; a
// qualified one that does not resolve is an error on both databases, so
// that a missing fence column fails instead of comparing a string.
func (f *Fence) col(quoted string) string { return f.bare + "." + quoted }

// Highest reads the row's fence token; ErrMissing if there is no row.
func (f *Fence) Highest(ctx context.Context, db Execer, id any) (int64, error) {
	var highest int64
	q := fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", f.col(f.token), f.table, f.col(f.id), f.placeholder(1))
	err := db.QueryRowContext(ctx, q, id).Scan(&highest)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s %v", ErrMissing, f.rawTable, id)
	}
	if err != nil {
		if f.noFenceColumn(err) {
			return 0, f.noFenceColumnError(err)
		}
		return 0, fmt.Errorf("sqlfence: read fence of %s %v: %w", f.rawTable, id, err)
	}
	return highest, nil
}

func (f *Fence) check(token int64, cols []Col) error {
	if token <= 0 {
		return invalid("token %d: tokens are positive", token)
	}
	seen := make(map[string]bool, len(cols))
	for _, c := range cols {
		if _, err := quote(c.Name); err != nil {
			return err
		}
		switch {
		case c.Name == f.tokenColumn:
			return invalid("a write may not set the fence column %q itself", c.Name)
		case c.Name == f.idColumn:
			return invalid("a write may not set the id column %q", c.Name)
		case seen[c.Name]:
			return invalid("column %q set twice", c.Name)
		}
		seen[c.Name] = true
	}
	return nil
}

// stmt is one fenced statement and what its errors need to say.
type stmt struct {
	op    string // "write" or "claim", for errors
	q     string
	args  []any
	id    any
	token int64
	// mayBeMissing: the statement does not create the row, so that no
	// row is ErrMissing rather than a row that changed under it.
	mayBeMissing bool
}

// result runs the fenced statement and tells a refused write apart: stale
// (with the highest token, read after the fact) or missing.
func (f *Fence) result(ctx context.Context, db Execer, s stmt) error {
	ctx, done := f.begin(ctx, "row", s.id, s.token)
	err := f.exec(ctx, db, s)
	done(err)
	return err
}

// begin starts a fenced statement for the hooks (fence.Hooks.Begin).
func (f *Fence) begin(ctx context.Context, kind string, id any, token int64) (context.Context, func(error)) {
	return f.hooks.Begin(ctx, "sql", "sql", func() []fence.WriteGuard {
		return []fence.WriteGuard{{Kind: kind, Key: fmt.Sprintf("%s/%v", f.rawTable, id), Token: token}}
	})
}

func (f *Fence) exec(ctx context.Context, db Execer, s stmt) error {
	res, err := db.ExecContext(ctx, s.q, s.args...)
	if err != nil {
		return f.driverError(s, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlfence: %s %s %v: rows affected: %w", s.op, f.rawTable, s.id, err)
	}
	if n > 0 {
		return nil
	}
	highest, err := f.Highest(ctx, db, s.id)
	if err != nil {
		if s.mayBeMissing || !errors.Is(err, ErrMissing) {
			return err
		}
	}
	if highest <= s.token {
		// The row changed between the write and this read: a writer with a
		// higher token refused ours, and the row has since gone back (a
		// delete and a new insert). Nothing was written.
		return fmt.Errorf("%w: %s %s %v with token %d refused, and the row now has token %d", ErrChanged, s.op, f.rawTable, s.id, s.token, highest)
	}
	return &fence.StaleError{Key: f.key(s.id), Token: s.token, Highest: highest}
}

// key names a row in a StaleError.
func (f *Fence) key(id any) string { return fmt.Sprintf("%s/%v", f.rawTable, id) }
