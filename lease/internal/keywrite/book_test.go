package keywrite

import "testing"

// The book forgets a name whose marker is neither present nor kept, and
// never forgets a kept one: its put may still land.
func TestBookForgetsOnlyUnkeptAbsentMarkers(t *testing.T) {
	var b Book
	b.set("a", 7)
	if got := b.get("a"); got != (marker{rev: 7}) {
		t.Fatalf("after set 7: %+v", got)
	}
	b.set("a", 0)
	if n := len(b.m); n != 0 {
		t.Fatalf("an absent, unkept marker is remembered: %v", b.m)
	}
	b.keep("b")
	b.set("b", 0)
	if got := b.get("b"); got != (marker{kept: true}) {
		t.Fatalf("a kept marker set absent: %+v, want kept", got)
	}
	b.set("b", 9)
	if got := b.get("b"); got != (marker{rev: 9, kept: true}) {
		t.Fatalf("a kept marker set to 9: %+v", got)
	}
}
