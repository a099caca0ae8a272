package main

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

func TestFileserver(t *testing.T) {
	var out bytes.Buffer
	res, err := run("", 2*time.Second, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if res.status != http.StatusConflict || res.object != "B's report" {
		t.Errorf("A's late write got %d and the object is %q; want 409 and B's report", res.status, res.object)
	}
	if !bytes.Contains(out.Bytes(), []byte(`"highest":`)) {
		t.Error("the 409 body was not shown")
	}
	if res.bToken <= res.aToken {
		t.Errorf("B's token %d not above A's %d", res.bToken, res.aToken)
	}
}
