package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	if err := run("", &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`(?s)A holds \S+, token (\d+).*B holds \S+, token (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output lacks both tokens:\n%s", out.String())
	}
	a, _ := strconv.ParseInt(m[1], 10, 64)
	b, _ := strconv.ParseInt(m[2], 10, 64)
	if b <= a {
		t.Errorf("B's token %d not above A's %d", b, a)
	}
}
