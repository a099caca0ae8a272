package fencehttp

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/leasefence/leasefence/fence/fencestore"
)

// Header names of the wire format.
const (
	HeaderLock    = "Leasefence-Lock"
	HeaderToken   = "Leasefence-Token"
	HeaderHighest = "Leasefence-Highest" // on a 409: the highest accepted token
	// HeaderRevision, on a 403, is etcd's revision when it did not confirm
	// the token (WithVerifier).
	HeaderRevision = "Leasefence-Revision"
	// HeaderClaim, sent as "1" with the two fencing headers, asks the
	// middleware to record the request's token before the handler runs,
	// whatever the method: see AttachClaim.
	HeaderClaim = "Leasefence-Claim"
)

// ErrBadHeader is wrapped by every error of ParseHeaders: a fencing header
// is missing, repeated or malformed.
var ErrBadHeader = errors.New("fencehttp: bad fencing header")

// SetHeaders sets the fencing headers for c on h, replacing any there.
func SetHeaders(h http.Header, c fencestore.Claim) {
	h.Set(HeaderLock, c.Name)
	h.Set(HeaderToken, fencestore.FormatToken(c.Token))
}

// ParseHeaders reads the fencing headers strictly. Every error wraps
// ErrBadHeader and says which header is wrong and why.
func ParseHeaders(h http.Header) (fencestore.Claim, error) {
	name, err := single(h, HeaderLock)
	if err != nil {
		return fencestore.Claim{}, err
	}
	if err := fencestore.CheckName(name); err != nil {
		return fencestore.Claim{}, fmt.Errorf("%w: %s %w", ErrBadHeader, HeaderLock, err)
	}
	raw, err := single(h, HeaderToken)
	if err != nil {
		return fencestore.Claim{}, err
	}
	token, err := ParseToken(raw)
	if err != nil {
		return fencestore.Claim{}, err
	}
	return fencestore.Claim{Name: name, Token: token}, nil
}

// ParseToken parses a token in canonical decimal (fencestore.ParseToken).
// Errors wrap ErrBadHeader.
func ParseToken(s string) (int64, error) {
	t, err := fencestore.ParseToken(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %w", ErrBadHeader, HeaderToken, err)
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
