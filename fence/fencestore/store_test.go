package fencestore_test

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

func TestMemoryStoreDo(t *testing.T) {
	etcdproc.LeakCheck(t)
	s := fencestore.NewMemoryStore()
	ctx := etcdproc.Ctx(t, 10*time.Second)
	var log []int64
	write := func(tok int64) func() error { return func() error { log = append(log, tok); return nil } }
	for _, tok := range []int64{3, 3, 7} {
		if err := s.Do(ctx, fencestore.Claim{Name: "n", Token: tok}, write(tok)); err != nil {
			t.Fatalf("Do(%d): %v", tok, err)
		}
	}
	err := s.Do(ctx, fencestore.Claim{Name: "n", Token: 5}, write(5))
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Highest != 7 || se.Token != 5 {
		t.Fatalf("Do(5) after 7: %v", err)
	}
	failing := errors.New("disk full")
	if err := s.Do(ctx, fencestore.Claim{Name: "n", Token: 9}, func() error { return failing }); !errors.Is(err, failing) {
		t.Fatalf("Do with a failing write: %v", err)
	}
	if h := s.Highest("n"); h != 7 {
		t.Errorf("highest = %d after a failed write, want 7", h)
	}
	if fmt.Sprint(log) != "[3 3 7]" {
		t.Errorf("writes run: %v", log)
	}
	if err := s.Do(ctx, fencestore.Claim{Name: "", Token: 1}, nil); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("Do with an empty name: %v", err)
	}
}

// ClaimOf refuses, before anything is sent, what no server could accept.
func TestClaimOf(t *testing.T) {
	cases := []struct {
		name string
		h    fence.Holder
		want error
	}{
		{"nil", nil, fence.ErrInvalidArgument},
		{"empty name", holder{"", 5, nil}, fence.ErrInvalidArgument},
		{"zero token", holder{"n", 0, nil}, fence.ErrInvalidArgument},
		{"control character", holder{"a\nb", 5, nil}, fence.ErrInvalidArgument},
		{"ended", holder{"n", 5, errors.New("lease expired")}, fence.ErrNotHeld},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := fencestore.ClaimOf(tc.h); !errors.Is(err, tc.want) {
				t.Fatalf("ClaimOf: %v, want %v", err, tc.want)
			}
		})
	}
	c, err := fencestore.ClaimOf(holder{"shards/7", 42, nil})
	if err != nil || c != (fencestore.Claim{Name: "shards/7", Token: 42}) {
		t.Fatalf("ClaimOf = %+v, %v", c, err)
	}
}

type holder struct {
	name  string
	token int64
	err   error
}

func (h holder) Name() string { return h.name }
func (h holder) Key() string  { return h.name + "/key" }
func (h holder) Token() int64 { return h.token }
func (h holder) Err() error   { return h.err }

// Every token has one text: FormatToken's, which ParseToken reads back.
func TestTokenText(t *testing.T) {
	for _, tok := range []int64{1, 9, 10, 1 << 40, math.MaxInt64} {
		got, err := fencestore.ParseToken(fencestore.FormatToken(tok))
		if err != nil || got != tok {
			t.Errorf("round trip of %d: %d, %v", tok, got, err)
		}
	}
	for _, s := range []string{"", "0", "007", "-1", "+1", " 1", "1 ", "0x10", "9223372036854775808", "1e3"} {
		var r fencestore.Reason
		if _, err := fencestore.ParseToken(s); !errors.As(err, &r) {
			t.Errorf("ParseToken(%q) = %v, want a Reason", s, err)
		}
	}
}
