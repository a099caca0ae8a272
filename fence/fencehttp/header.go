package fencehttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Header names of the wire format.
const (
	HeaderLock    = "Leasefence-Lock"
	HeaderToken   = "Leasefence-Token"
	HeaderHighest = "Leasefence-Highest" // on a 409: the highest accepted token
	// HeaderClaim, sent as "1" with the two fencing headers, asks the
	// middleware to record the request's token before the handler runs,
	// whatever the method: see AttachClaim.
	HeaderClaim = "Leasefence-Claim"
)

// MaxNameLen bounds the lock name a request may carry.
const MaxNameLen = 512

// ErrBadHeader is wrapped by every error of ParseHeaders: a fencing header
// is missing, repeated or malformed.
var ErrBadHeader = errors.New("fencehttp: bad fencing header")

// Claim is what a request says about itself: the lock it was sent under and
// that holding's token.
type Claim struct {
	Name  string
	Token int64
}

// SetHeaders sets the fencing headers for c on h, replacing any there.
func SetHeaders(h http.Header, c Claim) {
	h.Set(HeaderLock, c.Name)
	h.Set(HeaderToken, strconv.FormatInt(c.Token, 10))
}

// ParseHeaders reads the fencing headers strictly. Every error wraps
// ErrBadHeader and says which header is wrong and why.
func ParseHeaders(h http.Header) (Claim, error) {
	name, err := single(h, HeaderLock)
	if err != nil {
		return Claim{}, err
	}
	if err := checkName(name); err != nil {
		return Claim{}, fmt.Errorf("%w: %s %w", ErrBadHeader, HeaderLock, err)
	}
	raw, err := single(h, HeaderToken)
	if err != nil {
		return Claim{}, err
	}
	token, err := ParseToken(raw)
	if err != nil {
		return Claim{}, err
	}
	return Claim{Name: name, Token: token}, nil
}

// ParseToken parses a token in canonical decimal: digits only, no leading
// zero, from 1 to math.MaxInt64. Errors wrap ErrBadHeader.
func ParseToken(s string) (int64, error) {
	switch {
	case s == "":
		return 0, fmt.Errorf("%w: %s is empty", ErrBadHeader, HeaderToken)
	case len(s) > 19:
		return 0, fmt.Errorf("%w: %s %.30q is too long for a 63-bit token", ErrBadHeader, HeaderToken, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %s %q: only decimal digits are allowed", ErrBadHeader, HeaderToken, s)
		}
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("%w: %s %q: tokens are positive and written without leading zeros", ErrBadHeader, HeaderToken, s)
	}
	t, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q overflows a 63-bit token", ErrBadHeader, HeaderToken, s)
	}
	return t, nil
}

// claimed reads the claim header: absent is no claim, a single "1" is one.
// Anything else is refused rather than read as no claim, since a client
// that meant to claim would then read unprotected without knowing it.
func claimed(h http.Header) (bool, error) {
	vs := h.Values(HeaderClaim)
	switch {
	case len(vs) == 0:
		return false, nil
	case len(vs) > 1:
		return false, fmt.Errorf("%w: %s given %d times", ErrBadHeader, HeaderClaim, len(vs))
	case vs[0] != "1":
		return false, fmt.Errorf("%w: %s %.30q: the only value is \"1\"", ErrBadHeader, HeaderClaim, vs[0])
	}
	return true, nil
}

func single(h http.Header, key string) (string, error) {
	vs := h.Values(key)
	switch len(vs) {
	case 0:
		return "", fmt.Errorf("%w: %s is missing", ErrBadHeader, key)
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("%w: %s given %d times", ErrBadHeader, key, len(vs))
}

// errName is the reason a lock name cannot be sent in a header; its text
// follows the header's or the option's name.
type errName string

func (e errName) Error() string { return string(e) }

func checkName(name string) error {
	switch {
	case name == "":
		return errName("is empty")
	case len(name) > MaxNameLen:
		return errName(fmt.Sprintf("is longer than %d bytes", MaxNameLen))
	case !utf8.ValidString(name):
		return errName("is not UTF-8")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return errName(fmt.Sprintf("%q has a non-printing character", name))
		}
	}
	return nil
}
