package sqlfence

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/leasefence/leasefence/fence"
)

// refusalText starts the message of the trigger's refusal; refusalPattern
// reads the two tokens back out of it.
const refusalText = "sqlfence: fence token lowered: "

var refusalPattern = regexp.MustCompile(`sqlfence: fence token lowered: (-?\d+) below (-?\d+)`)

// TriggerDDL returns statements that make the database itself refuse any
// UPDATE that lowers the fence column of a row: a BEFORE UPDATE trigger.
// Run them once, after the fence column exists (ColumnDDL or
// AddColumnDDL); running them again changes nothing.
//
// The fence's own writes never lower the column and keep working, and
// still report a stale token as a *fence.StaleError. What the trigger adds
// is protection from writers that skip the fence: an admin script or a
// migration that updates the row without the fence's WHERE clause can no
// longer move it backwards. Such a statement fails with the database's
// error, which TriggerRefusal turns into a *fence.StaleError. The trigger
// does not guard inserts or deletes: a row deleted and inserted anew
// starts over.
//
// On PostgreSQL the trigger calls a PL/pgSQL function named after the
// table ("<table>_fence_guard", in the table's schema); on SQLite the
// message carries the tokens through RAISE with an expression, which needs
// a recent SQLite (3.54 in modernc.org/sqlite accepts it).
func (f *Fence) TriggerDDL() []string {
	name := f.guardName()
	if f.dialect == Postgres {
		fn := name
		if f.schema != "" {
			fn = f.schema + "." + name
		}
		return []string{
			fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
	IF NEW.%s < OLD.%s THEN
		RAISE EXCEPTION '%s%% below %%', NEW.%s, OLD.%s USING ERRCODE = 'check_violation';
	END IF;
	RETURN NEW;
END
$fence$`, fn, f.token, f.token, refusalText, f.token, f.token),
			fmt.Sprintf("DROP TRIGGER IF EXISTS %s ON %s", name, f.table),
			fmt.Sprintf("CREATE TRIGGER %s BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()", name, f.table, fn),
		}
	}
	trigger := name
	if f.schema != "" {
		trigger = f.schema + "." + name
	}
	return []string{fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s BEFORE UPDATE OF %s ON %s FOR EACH ROW
WHEN NEW.%s < OLD.%s
BEGIN
	SELECT RAISE(ABORT, '%s' || NEW.%s || ' below ' || OLD.%s);
END`, trigger, f.token, f.bare, f.token, f.token, refusalText, f.token, f.token)}
}

// guardName is the trigger's (and on PostgreSQL the function's) name,
// quoted: the table's own name with "_fence_guard" after it.
func (f *Fence) guardName() string {
	raw := strings.Split(f.rawTable, ".")
	q, _ := quote(raw[len(raw)-1] + "_fence_guard")
	return q
}

// TriggerRefusal returns the *fence.StaleError that err stands for if err
// is the refusal of the trigger that TriggerDDL installs, for the row id,
// and nil for any other error. It reads only the error's text, which both
// PostgreSQL's and SQLite's drivers pass on.
func (f *Fence) TriggerRefusal(err error, id any) *fence.StaleError {
	if err == nil {
		return nil
	}
	m := refusalPattern.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	token, err1 := strconv.ParseInt(m[1], 10, 64)
	highest, err2 := strconv.ParseInt(m[2], 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	return &fence.StaleError{Key: f.key(id), Token: token, Highest: highest}
}
