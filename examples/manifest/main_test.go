package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

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

// The example end to end: A, stopped past its lease, has its late commit
// refused naming both tokens; the manifest is B's, and the reader saw its
// token only go up.
func TestManifest(t *testing.T) {
	var out bytes.Buffer
	res, err := run("", 2*time.Second, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log("\n" + text)
	if !res.safe() || res.bToken <= res.aToken {
		t.Fatalf("outcome %+v not safe", res)
	}
	m := regexp.MustCompile(`commit REFUSED: fence: stale token (\d+) at "[^"]+": token (\d+) already accepted`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no refusal naming both tokens")
	}
	if a, _ := strconv.ParseInt(m[1], 10, 64); a != res.aToken {
		t.Errorf("refusal names token %d, A's is %d", a, res.aToken)
	}
	if b, _ := strconv.ParseInt(m[2], 10, 64); b != res.bToken {
		t.Errorf("refusal names token %d as accepted, B's is %d", b, res.bToken)
	}
	if len(res.tokens) != 2 || res.tokens[0] != res.aToken || res.tokens[1] != res.bToken {
		t.Errorf("reader saw tokens %v, want [%d %d]", res.tokens, res.aToken, res.bToken)
	}
}
