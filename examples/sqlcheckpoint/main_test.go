package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestSQLCheckpoint(t *testing.T) {
	dsns := map[string]string{"sqlite": ""}
	switch dsn := os.Getenv("LEASEFENCE_POSTGRES_DSN"); {
	case dsn != "":
		dsns["postgres"] = dsn
	case os.Getenv("CI") == "true":
		t.Fatal("LEASEFENCE_POSTGRES_DSN is not set, and CI=true: the PostgreSQL run must not be skipped")
	default:
		t.Log("LEASEFENCE_POSTGRES_DSN not set: PostgreSQL run skipped")
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			res, err := run("", dsn, 2*time.Second, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if !res.refused || res.bOffset != 400 || res.owner != "A" || res.offset != 500 {
				t.Errorf("outcome %+v: want A's late commit refused, B at 400, A resumed to 500", res)
			}
			if res.bToken <= res.aToken || res.resumeToken <= res.bToken {
				t.Errorf("tokens A %d, B %d, A again %d: want them increasing", res.aToken, res.bToken, res.resumeToken)
			}
			// B's claim, not a write of B's, refused A's late commit: it
			// came after B's read of 200 and before B's first commit.
			if res.refusedBy != res.bToken || res.bFrom != 200 {
				t.Errorf("A's late commit refused by token %d, B resumed after %d: want B's token %d and 200", res.refusedBy, res.bFrom, res.bToken)
			}
			inOrder(t, out.String(),
				"claims the row, resumes after offset 200",
				"commit of offset 300 REFUSED",
				"commits offset 300 with token",
				"claims the row, resumes after offset 400",
			)
		})
	}
}

// inOrder fails the test unless each of events appears in out after the
// one before it.
func inOrder(t *testing.T, out string, events ...string) {
	t.Helper()
	rest := out
	for _, e := range events {
		i := strings.Index(rest, e)
		if i < 0 {
			t.Fatalf("timeline: %q missing, or not after the events before it", e)
		}
		rest = rest[i+len(e):]
	}
}
