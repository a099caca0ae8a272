package fencehttp_test

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
)

func TestParseHeaders(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	const L, T = fencehttp.HeaderLock, fencehttp.HeaderToken
	cases := []struct {
		name  string
		h     http.Header
		want  fencestore.Claim
		inMsg string // part of the error message; empty for success
	}{
		{"valid", hdr(L, "jobs", T, "42"), fencestore.Claim{Name: "jobs", Token: 42}, ""},
		{"max int64", hdr(L, "jobs", T, "9223372036854775807"), fencestore.Claim{Name: "jobs", Token: math.MaxInt64}, ""},
		{"nested name", hdr(L, "jobs/7", T, "1"), fencestore.Claim{Name: "jobs/7", Token: 1}, ""},
		{"no headers", hdr(), fencestore.Claim{}, L + " is missing"},
		{"no token", hdr(L, "jobs"), fencestore.Claim{}, T + " is missing"},
		{"no lock", hdr(T, "5"), fencestore.Claim{}, L + " is missing"},
		{"empty token", hdr(L, "jobs", T, ""), fencestore.Claim{}, "empty"},
		{"empty lock", hdr(L, "", T, "5"), fencestore.Claim{}, "empty"},
		{"letters", hdr(L, "jobs", T, "abc"), fencestore.Claim{}, "only decimal digits"},
		{"negative", hdr(L, "jobs", T, "-5"), fencestore.Claim{}, "only decimal digits"},
		{"plus sign", hdr(L, "jobs", T, "+5"), fencestore.Claim{}, "only decimal digits"},
		{"zero", hdr(L, "jobs", T, "0"), fencestore.Claim{}, "positive"},
		{"leading zero", hdr(L, "jobs", T, "007"), fencestore.Claim{}, "leading zeros"},
		{"space", hdr(L, "jobs", T, " 5"), fencestore.Claim{}, "only decimal digits"},
		{"hex", hdr(L, "jobs", T, "0x10"), fencestore.Claim{}, "only decimal digits"},
		{"float", hdr(L, "jobs", T, "5.0"), fencestore.Claim{}, "only decimal digits"},
		{"overflow by one", hdr(L, "jobs", T, "9223372036854775808"), fencestore.Claim{}, "overflows"},
		{"far too long", hdr(L, "jobs", T, strings.Repeat("9", 40)), fencestore.Claim{}, "too long"},
		{"two tokens", hdr(L, "jobs", T, "5", T, "6"), fencestore.Claim{}, "given 2 times"},
		{"two locks", hdr(L, "a", L, "b", T, "5"), fencestore.Claim{}, "given 2 times"},
		{"control char in lock", hdr(L, "jo\x01bs", T, "5"), fencestore.Claim{}, "non-printing"},
		{"bad utf-8 in lock", hdr(L, "jo\xffbs", T, "5"), fencestore.Claim{}, "not UTF-8"},
		{"lock too long", hdr(L, strings.Repeat("x", fencestore.MaxNameLen+1), T, "5"), fencestore.Claim{}, "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fencehttp.ParseHeaders(tc.h)
			if tc.inMsg == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseHeaders = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, fencehttp.ErrBadHeader) || !strings.Contains(err.Error(), tc.inMsg) {
				t.Fatalf("ParseHeaders = %+v, %v; want ErrBadHeader mentioning %q", got, err, tc.inMsg)
			}
			if got != (fencestore.Claim{}) {
				t.Errorf("a failed parse returned %+v", got)
			}
		})
	}
}

// Whatever a header holds, a token comes out only if the header was its
// canonical decimal form, and every positive int64 round-trips.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "-1", "007", "+5", " 5", "9223372036854775807", "9223372036854775808", "1e9", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fencehttp.ParseToken(s)
		if err != nil {
			if !errors.Is(err, fencehttp.ErrBadHeader) {
				t.Fatalf("ParseToken(%q) error %v does not wrap ErrBadHeader", s, err)
			}
			if n, perr := strconv.ParseInt(s, 10, 64); perr == nil && n > 0 && strconv.FormatInt(n, 10) == s {
				t.Fatalf("ParseToken(%q) refused a canonical token: %v", s, err)
			}
			return
		}
		if tok <= 0 || strconv.FormatInt(tok, 10) != s {
			t.Fatalf("ParseToken(%q) = %d, which is not its canonical form", s, tok)
		}
	})
}

func FuzzTokenRoundTrip(f *testing.F) {
	f.Add(int64(1))
	f.Add(int64(math.MaxInt64))
	f.Add(int64(-1))
	f.Fuzz(func(t *testing.T, v int64) {
		h := http.Header{}
		fencehttp.SetHeaders(h, fencestore.Claim{Name: "n", Token: v})
		c, err := fencehttp.ParseHeaders(h)
		if v <= 0 {
			if err == nil {
				t.Fatalf("token %d accepted", v)
			}
			return
		}
		if err != nil || c.Token != v {
			t.Fatalf("token %d came back as %d, %v", v, c.Token, err)
		}
	})
}
