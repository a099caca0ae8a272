package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/exampleenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(exampleenv.ChildEnv) == "worker-a" {
		if err := workerA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker A:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example end to end: A, stopped past its lease inside its Append,
// has it refused by the service with Aborted and a *fence.StaleError
// naming both tokens; the ledger is A's first entry, then B's.
func TestGRPCLedger(t *testing.T) {
	etcdtest.LeakCheck(t)
	var out bytes.Buffer
	res, err := run("", 2*time.Second, &out)
	text := out.String()
	t.Log("\n" + text)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !res.safe() || res.bToken <= res.aToken {
		t.Fatalf("outcome %+v not safe", res)
	}
	if len(res.ledger) != 2 || res.ledger[0] != fmt.Sprintf("A1 (token %d)", res.aToken) || res.ledger[1] != fmt.Sprintf("B1 (token %d)", res.bToken) {
		t.Errorf("ledger %q, want A1 then B1", res.ledger)
	}
	m := regexp.MustCompile(`Append REFUSED by the service: Aborted: fencegrpc: fence: stale token (\d+) at "[^"]+": token (\d+) already accepted`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no Aborted refusal naming both tokens")
	}
	if a, _ := strconv.ParseInt(m[1], 10, 64); a != res.aToken {
		t.Errorf("refusal names token %d, A's is %d", a, res.aToken)
	}
	if b, _ := strconv.ParseInt(m[2], 10, 64); b != res.bToken {
		t.Errorf("refusal names token %d as accepted, B's is %d", b, res.bToken)
	}
	if !regexp.MustCompile(`appends again: refused before sending: FailedPrecondition: `).MatchString(text) {
		t.Error("A's Append after its lock ended was not refused before sending")
	}
}
