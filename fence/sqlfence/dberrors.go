package sqlfence

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// SQLSTATE codes of PostgreSQL errors that get a clearer message.
const (
	stateNotNull         = "23502" // not_null_violation
	stateUndefinedColumn = "42703" // undefined_column
)

// The texts naming the column of an undefined-column error: PostgreSQL's
// (`column "c" does not exist`, `column t.c does not exist`, `column "c"
// of relation "t" does not exist`) and SQLite's (`no such column: t.c`,
// `table t has no column named c`, before the driver's " (1)").
var undefinedColumn = []*regexp.Regexp{
	regexp.MustCompile(`column (.+?)(?: of relation ".*")? does not exist`),
	regexp.MustCompile(`no such column: (.+?)(?: \(\d+\)|$)`),
	regexp.MustCompile(`has no column named (.+?)(?: \(\d+\)|$)`),
}

// sqlState reads a PostgreSQL error's code without importing a driver:
// pgx's *pgconn.PgError has this method.
type sqlState interface{ SQLState() string }

func hasState(err error, code string) bool {
	var s sqlState
	return errors.As(err, &s) && s.SQLState() == code
}

// driverError turns the error of a failed statement into the package's
// own where it knows better than the driver: the trigger's refusal, a
// missing fence column, a claim on a table it cannot insert into.
func (f *Fence) driverError(s stmt, err error) error {
	if stale := f.TriggerRefusal(err, s.id); stale != nil {
		return stale
	}
	if f.noFenceColumn(err) {
		return f.noFenceColumnError(err)
	}
	if s.op == "claim" && notNull(err) {
		return fmt.Errorf("sqlfence: claim %s %v: the row is missing and the table has a NOT NULL column without a default, "+
			"while a claim inserts only the id and the fence column: create the row first (Upsert) or "+
			"give the column a default: %w", f.rawTable, s.id, err)
	}
	return fmt.Errorf("sqlfence: %s %s %v: %w", s.op, f.rawTable, s.id, err)
}

func (f *Fence) noFenceColumnError(err error) error {
	return fmt.Errorf("sqlfence: table %s has no fence column %q: add it with AddColumnDDL: %w", f.rawTable, f.tokenColumn, err)
}

// noFenceColumn tells whether err is the database's complaint about an
// undefined column that is the fence column, not another column a write
// names.
func (f *Fence) noFenceColumn(err error) bool {
	msg := err.Error()
	if f.dialect == Postgres && !hasState(err, stateUndefinedColumn) {
		return false
	}
	for _, re := range undefinedColumn {
		m := re.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		ref := m[1]
		if len(ref) > 1 && ref[0] == '"' && ref[len(ref)-1] == '"' {
			ref = ref[1 : len(ref)-1] // PostgreSQL's "c", not quoted inside
		}
		return ref == f.tokenColumn || strings.HasSuffix(ref, "."+f.tokenColumn)
	}
	return false
}

// notNull tells whether err is a NOT NULL violation: PostgreSQL's code, or
// SQLite's message.
func notNull(err error) bool {
	return hasState(err, stateNotNull) || strings.Contains(err.Error(), "NOT NULL constraint failed")
}
