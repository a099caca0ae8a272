package main

import (
	"bytes"
	"os"
	"testing"
	"time"
)

func TestSQLCheckpoint(t *testing.T) {
	dsns := map[string]string{"sqlite": ""}
	if dsn := os.Getenv("LEASEFENCE_POSTGRES_DSN"); dsn != "" {
		dsns["postgres"] = dsn
	} else {
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
		})
	}
}
