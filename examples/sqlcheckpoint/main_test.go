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
			if !res.refused || res.owner != "B" || res.offset != 400 {
				t.Errorf("outcome %+v: want A refused, row at B's offset 400", res)
			}
			if res.bToken <= res.aToken {
				t.Errorf("B's token %d not above A's %d", res.bToken, res.aToken)
			}
		})
	}
}
