package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/exampleenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(exampleenv.ChildEnv) == "client-a" {
		if err := clientA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "client A:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example itself, end to end: the unfenced run loses B's update, the
// fenced run refuses A's write and names both tokens.
func TestPause(t *testing.T) {
	var out bytes.Buffer
	if err := run("", 2*time.Second, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log("\n" + text)
	lost := regexp.MustCompile(`unfenced: A's write with token (\d+) overwrote B's \(token (\d+)\)`).FindStringSubmatch(text)
	safe := regexp.MustCompile(`fenced  : A's write with token (\d+) refused, B's data \(token (\d+)\) kept`).FindStringSubmatch(text)
	if lost == nil || safe == nil {
		t.Fatal("summary lacks the unfenced lost update or the fenced refusal")
	}
	a, _ := strconv.ParseInt(safe[1], 10, 64)
	b, _ := strconv.ParseInt(safe[2], 10, 64)
	if b <= a {
		t.Errorf("B's token %d not above A's %d", b, a)
	}
	refusal := fmt.Sprintf("stale token %d", a)
	if !strings.Contains(text, refusal) || !strings.Contains(text, fmt.Sprintf("token %d already accepted", b)) {
		t.Errorf("the refusal does not name both tokens %d and %d", a, b)
	}
}
