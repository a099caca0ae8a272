package chaos

import (
	"testing"
	"time"
)

// The model itself, on hand-made histories: it must accept what a fenced
// register may do and reject a lost update.
func TestModel(t *testing.T) {
	w := func(reg, kind string, token int64, val string) Input {
		return Input{Register: reg, Kind: kind, Write: true, Token: token, Value: val}
	}
	r := func(reg string) Input { return Input{Register: reg} }
	type step struct {
		in        Input
		out       Output
		call, ret int64 // the history's clock
	}
	cases := []struct {
		name  string
		steps []step
		legal bool
	}{
		{"in order", []step{
			{w("x", KindResource, 1, "a"), Output{Outcome: OK}, 0, 1},
			{w("x", KindResource, 2, "b"), Output{Outcome: OK}, 2, 3},
			{r("x"), Output{Value: "b"}, 4, 5},
		}, true},
		{"stale refused", []step{
			{w("x", KindResource, 2, "b"), Output{Outcome: OK}, 0, 1},
			{w("x", KindResource, 1, "a"), Output{Outcome: Refused}, 2, 3},
			{r("x"), Output{Value: "b"}, 4, 5},
		}, true},
		{"lost update: stale accepted after newer", []step{
			{w("x", KindResource, 2, "b"), Output{Outcome: OK}, 0, 1},
			{w("x", KindResource, 1, "a"), Output{Outcome: OK}, 2, 3},
		}, false},
		{"read sees a value never accepted", []step{
			{w("x", KindResource, 2, "b"), Output{Outcome: OK}, 0, 1},
			{r("x"), Output{Value: "a"}, 2, 3},
		}, false},
		{"refused although not stale", []step{
			{w("x", KindSQL, 2, "b"), Output{Outcome: Refused}, 0, 1},
		}, false},
		{"held may refuse", []step{
			{w("x", KindHeld, 2, "b"), Output{Outcome: Refused}, 0, 1},
		}, true},
		{"concurrent writes in either order", []step{
			{w("x", KindResource, 2, "b"), Output{Outcome: OK}, 0, 10},
			{w("x", KindResource, 1, "a"), Output{Outcome: OK}, 1, 9},
			{r("x"), Output{Value: "b"}, 11, 12},
		}, true},
		{"unknown may have happened", []step{
			{w("x", KindResource, 1, "a"), Output{Outcome: Unknown}, 0, 1},
			{r("x"), Output{Value: "a"}, 2, 3},
		}, true},
		{"manifest: stale refused, equal token accepted", []step{
			{w("m", KindManifest, 2, "b"), Output{Outcome: OK}, 0, 1},
			{w("m", KindManifest, 1, "a"), Output{Outcome: Refused}, 2, 3},
			{w("m", KindManifest, 2, "c"), Output{Outcome: OK}, 4, 5},
			{r("m"), Output{Value: "c"}, 6, 7},
		}, true},
		{"manifest: refused although not stale", []step{
			{w("m", KindManifest, 2, "b"), Output{Outcome: Refused}, 0, 1},
		}, false},
		{"failed changes nothing", []step{
			{w("m", KindManifest, 1, "a"), Output{Outcome: OK}, 0, 1},
			{w("m", KindManifest, 2, "b"), Output{Outcome: Failed}, 2, 3},
			{r("m"), Output{Value: "a"}, 4, 5},
		}, true},
		{"failed but applied after all", []step{
			{w("m", KindManifest, 1, "a"), Output{Outcome: OK}, 0, 1},
			{w("m", KindManifest, 2, "b"), Output{Outcome: Failed}, 2, 3},
			{r("m"), Output{Value: "b"}, 4, 5},
		}, false},
		{"unknown may not have happened", []step{
			{w("x", KindResource, 1, "a"), Output{Outcome: Unknown}, 0, 1},
			{r("x"), Output{Value: ""}, 2, 3},
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory()
			for i, s := range tc.steps {
				h.ops = append(h.ops, opAt(i, s.in, s.out, s.call, s.ret))
			}
			res, _ := h.Check(5 * time.Second)
			if (res == "Ok") != tc.legal {
				t.Errorf("checker said %s, want legal=%v", res, tc.legal)
			}
		})
	}
}
