package fencestore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// recorder is a Store that answers as told and remembers what it was asked.
type recorder struct {
	stale    bool
	accepted []fencestore.Claim
}

func (r *recorder) Accept(_ context.Context, name string, token int64) error {
	if r.stale {
		return &fence.StaleError{Key: name, Token: token, Highest: token + 1}
	}
	r.accepted = append(r.accepted, fencestore.Claim{Name: name, Token: token})
	return nil
}

var errBad = errors.New("bad input")

// Every combination of what a transport can read from a request, held to
// the properties the transports promise: a request passes fenced only
// with the server's lock name and, unless its handler checks (and it is
// not a claim), a token the Store accepted; a claim passes only once the
// Store recorded it; nothing unfenced touches the Store; a claim on an
// unfenced request and a wrong or unreadable lock name are refused.
func TestCheckDecision(t *testing.T) {
	bools := []bool{false, true}
	for _, claim := range bools {
		for _, unchecked := range bools {
			for _, want := range []string{"", "L"} {
				for _, carried := range []string{"L", "other", "unreadable"} {
					for _, inHandler := range bools {
						for _, stale := range bools {
							name := fmt.Sprintf("claim=%v/unchecked=%v/want=%q/carried=%s/inHandler=%v/stale=%v", claim, unchecked, want, carried, inHandler, stale)
							t.Run(name, func(t *testing.T) {
								checkOne(t, claim, unchecked, want, carried, inHandler, stale)
							})
						}
					}
				}
			}
		}
	}
}

func checkOne(t *testing.T, claim, unchecked bool, want, carried string, inHandler, stale bool) {
	store := &recorder{stale: stale}
	c, fenced, err := fencestore.Check(context.Background(), store, fencestore.Request{
		Claim:     claim,
		Unchecked: unchecked,
		Lock:      func() string { return want },
		Read: func() (fencestore.Claim, error) {
			if carried == "unreadable" {
				return fencestore.Claim{}, errBad
			}
			return fencestore.Claim{Name: carried, Token: 7}, nil
		},
		InHandler: inHandler,
		ClaimKey:  "claim",
		Bad:       func(reason string) error { return fmt.Errorf("%w: %s", errBad, reason) },
	})
	recorded := len(store.accepted) == 1
	passes := err == nil
	switch {
	case fenced && !passes:
		t.Fatalf("fenced with an error: %v", err)
	case !claim && unchecked || !claim && want == "":
		if !passes || fenced || len(store.accepted) != 0 {
			t.Fatalf("unfenced request: fenced=%v err=%v accepted=%v", fenced, err, store.accepted)
		}
	case claim && want == "", carried != want:
		if passes || !errors.Is(err, errBad) || len(store.accepted) != 0 {
			t.Fatalf("want a refusal for bad input, got fenced=%v err=%v accepted=%v", fenced, err, store.accepted)
		}
	case claim || !inHandler:
		if stale != errors.Is(err, fence.ErrStale) || passes == stale || passes != recorded || passes && (!fenced || c != fencestore.Claim{Name: "L", Token: 7}) {
			t.Fatalf("checked request: fenced=%v claim=%+v err=%v accepted=%v", fenced, c, err, store.accepted)
		}
	default: // the handler checks
		if !passes || !fenced || recorded || c != (fencestore.Claim{Name: "L", Token: 7}) {
			t.Fatalf("request left to its handler: fenced=%v claim=%+v err=%v accepted=%v", fenced, c, err, store.accepted)
		}
	}
}
