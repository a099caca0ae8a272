package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// The example end to end: A's late commit is refused naming both tokens,
// and the reader saw the manifest's token only go up.
func TestManifest(t *testing.T) {
	var out bytes.Buffer
	if err := run("", &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log("\n" + text)
	m := regexp.MustCompile(`refused: fence: stale token (\d+) at "[^"]+": token (\d+) already accepted`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no refusal naming both tokens")
	}
	a, _ := strconv.ParseInt(m[1], 10, 64)
	b, _ := strconv.ParseInt(m[2], 10, 64)
	if b <= a {
		t.Errorf("B's token %d not above A's %d", b, a)
	}
}
