package fencehttp

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// Transport is an http.RoundTripper that attaches Holder's name and token to
// every request. It never modifies the caller's request (it sends a clone).
// It is safe for concurrent use if Base is. A request on which the caller
// set HeaderClaim to "1" is sent as a claim, as AttachClaim would make it.
//
// A holder already known to have lost its lock gets an error wrapping
// fence.ErrNotHeld and its Err, and nothing is sent: an early warning. The
// server's check is what protects the resource.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Holder is the lock holding the requests are sent under.
	Holder fence.Holder
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, err := claimOf(t.Holder)
	if err != nil {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, err
	}
	r := req.Clone(req.Context())
	SetHeaders(r.Header, c)
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// CloseIdleConnections closes Base's idle connections, if Base can, as
// http.Client.CloseIdleConnections expects of a RoundTripper.
func (t *Transport) CloseIdleConnections() {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if c, ok := base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Attach sets the fencing headers of h on req, for clients that build
// requests by hand. It fails as Transport does, and then sets nothing.
func Attach(req *http.Request, h fence.Holder) error {
	c, err := claimOf(h)
	if err != nil {
		return err
	}
	SetHeaders(req.Header, c)
	return nil
}

// AttachClaim is Attach for a claim: it also sets HeaderClaim, so that the
// middleware records h's token before the handler runs, whatever the
// method. A new holder claims before it first reads what the lock
// protects; a GET with a claim is "claim, then read" in one round trip (the
// package documentation says what a claim guarantees). It fails as Attach
// does, and then sets nothing. Through a Transport, a request claims with
// HeaderClaim set to "1" on it.
func AttachClaim(req *http.Request, h fence.Holder) error {
	if err := Attach(req, h); err != nil {
		return err
	}
	req.Header.Set(HeaderClaim, "1")
	return nil
}

func claimOf(h fence.Holder) (fencestore.Claim, error) {
	c, err := fencestore.ClaimOf(h)
	if err != nil {
		return fencestore.Claim{}, fmt.Errorf("fencehttp: %w", err)
	}
	return c, nil
}

// CheckResponse turns a middleware's 409 answer, to a claim as to any other
// request, into the *fence.StaleError it reports (errors.Is
// fence.ErrStale), and its 403 for a token etcd did not confirm into the
// *fence.UnverifiedError (errors.Is fence.ErrUnverified). Any other
// response gives nil. It reads headers only, so the body stays unread for
// the caller.
func CheckResponse(resp *http.Response) error {
	var token int64
	if resp.Request != nil {
		token, _ = strconv.ParseInt(resp.Request.Header.Get(HeaderToken), 10, 64)
	}
	name := resp.Header.Get(HeaderLock)
	switch resp.StatusCode {
	case http.StatusConflict:
		highest, err := strconv.ParseInt(resp.Header.Get(HeaderHighest), 10, 64)
		if err != nil {
			return nil // a 409 of the handler's own, not the fence's
		}
		return &fence.StaleError{Key: name, Token: token, Highest: highest}
	case http.StatusForbidden:
		rev, err := strconv.ParseInt(resp.Header.Get(HeaderRevision), 10, 64)
		if err != nil {
			return nil // a 403 of the handler's own
		}
		return &fence.UnverifiedError{Name: name, Token: token, Revision: rev}
	}
	return nil
}
