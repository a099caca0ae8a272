package fencestore

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/leasefence/leasefence/fence"
)

// MaxNameLen bounds the lock name a request may carry.
const MaxNameLen = 512

// Claim is what a request says about itself: the lock it was sent under
// and that holding's token.
type Claim struct {
	Name  string
	Token int64
}

// Reason is why a lock name or a token cannot be read. Its text follows
// the name of the field it was read from, as in "Leasefence-Token is
// empty"; each transport wraps it with its own sentinel.
type Reason string

func (r Reason) Error() string { return string(r) }

// ParseToken parses a token in canonical decimal: digits only, no sign, no
// leading zero, no spaces, from 1 to math.MaxInt64. The one text of a
// token is the only one accepted, so that a proxy or a log cannot show two
// spellings of one token. Errors are a Reason.
func ParseToken(s string) (int64, error) {
	switch {
	case s == "":
		return 0, Reason("is empty")
	case len(s) > 19:
		return 0, Reason(fmt.Sprintf("%.30q is too long for a 63-bit token", s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, Reason(fmt.Sprintf("%q: only decimal digits are allowed", s))
		}
	}
	if s[0] == '0' {
		return 0, Reason(fmt.Sprintf("%q: tokens are positive and written without leading zeros", s))
	}
	t, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, Reason(fmt.Sprintf("%q overflows a 63-bit token", s))
	}
	return t, nil
}

// FormatToken is the canonical text of a token, the one ParseToken reads.
func FormatToken(t int64) string { return strconv.FormatInt(t, 10) }

// CheckName checks that name can be carried as a lock name: not empty, at
// most MaxNameLen bytes, UTF-8, printable. Errors are a Reason.
func CheckName(name string) error {
	switch {
	case name == "":
		return Reason("is empty")
	case len(name) > MaxNameLen:
		return Reason(fmt.Sprintf("is longer than %d bytes", MaxNameLen))
	case !utf8.ValidString(name):
		return Reason("is not UTF-8")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return Reason(fmt.Sprintf("%q has a non-printing character", name))
		}
	}
	return nil
}

// ClaimOf is the claim a request made under h carries. A holder known to
// have ended (fence.Ended) gives a *fence.NotHeldError carrying its Err,
// and a nil holder, an unusable name or a token below 1 an error wrapping
// fence.ErrInvalidArgument: in each case the request must not be sent.
func ClaimOf(h fence.Holder) (Claim, error) {
	if h == nil {
		return Claim{}, fmt.Errorf("%w: nil Holder", fence.ErrInvalidArgument)
	}
	c := Claim{Name: h.Name(), Token: h.Token()}
	if err := fence.Ended(h); err != nil {
		return Claim{}, &fence.NotHeldError{Key: h.Key(), Token: c.Token, Cause: err}
	}
	if err := CheckName(c.Name); err != nil || c.Token <= 0 {
		return Claim{}, fmt.Errorf("%w: lock %q token %d cannot be sent", fence.ErrInvalidArgument, c.Name, c.Token)
	}
	return c, nil
}
