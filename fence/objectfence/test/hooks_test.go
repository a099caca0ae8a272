package objectfence_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
)

// Each Claim and Commit on a real S3 gateway is reported to the hooks:
// its guard, with the manifest's key and the token, and its verdict; a
// stale one is counted as refused by "object".
func TestHooksHearClaimsAndCommits(t *testing.T) {
	type heard struct {
		w   fence.Write
		err error
	}
	var mu sync.Mutex
	var writes []heard
	var refused []string
	hooks := &fence.Hooks{
		Refused: func(guard string) {
			mu.Lock()
			defer mu.Unlock()
			refused = append(refused, guard)
		},
		Write: func(ctx context.Context, w fence.Write) (context.Context, func(error)) {
			return ctx, func(err error) {
				mu.Lock()
				defer mu.Unlock()
				writes = append(writes, heard{w, err})
			}
		},
	}
	f, _, _ := newFence(t, objectfence.WithHooks(hooks))
	ctx := testCtx(t)
	b4 := mustClaim(t, f, 4)
	mustClaim(t, f, 5)
	_, err := f.Commit(ctx, b4, []byte("late"))
	wantStale(t, err, 4, 5)

	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		kind  string
		token int64
		stale bool
	}{{"claim", 4, false}, {"claim", 5, false}, {"manifest", 4, true}}
	if len(writes) != len(want) {
		t.Fatalf("heard %d writes, want %d: %+v", len(writes), len(want), writes)
	}
	for i, w := range want {
		h := writes[i]
		g := h.w.Guards
		if h.w.Fence != "object" || len(g) != 1 || g[0].Kind != w.kind || g[0].Token != w.token || g[0].Key != f.Key() {
			t.Errorf("write %d: %+v, want an object %s guard on %q with token %d", i, h.w, w.kind, f.Key(), w.token)
		}
		if w.stale != errors.Is(h.err, fence.ErrStale) || (!w.stale && h.err != nil) {
			t.Errorf("write %d: verdict %v, stale wanted: %v", i, h.err, w.stale)
		}
	}
	if len(refused) != 1 || refused[0] != "object" {
		t.Errorf("refusals %v, want [object]", refused)
	}
}
