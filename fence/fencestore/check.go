package fencestore

import (
	"context"
	"fmt"
)

// Request is what a transport read from one incoming request, for Check.
type Request struct {
	// Claim: the request asks to be a claim, its marker read strictly
	// (a malformed marker is the transport's refusal, before Check).
	Claim bool
	// Unchecked: the request's method passes without a token, unless it
	// is a claim.
	Unchecked bool
	// Lock returns the lock name the server requires for the request, ""
	// if the server does not fence it.
	Lock func() string
	// Read returns the lock name and token the request carries, read
	// strictly; its errors are the transport's.
	Read func() (Claim, error)
	// InHandler: the handler's own write through the Store is the check,
	// so Check records only claims.
	InHandler bool
	// ClaimKey names the claim marker in messages (a header, a metadata
	// key); Bad wraps a reason in the transport's error for bad input.
	ClaimKey string
	Bad      func(reason string) error
	// Verify, if set, confirms the claim's token before the Store or the
	// handler sees it (Verification.Check, EtcdStore.Verify); an
	// EtcdStore that is to Accept the token verifies it there instead,
	// before it writes anything.
	Verify func(ctx context.Context, c Claim) error
}

// Check is the decision both transports make before a handler runs:
// whether the request is fenced, and if it is, whether it may pass. A
// fenced request passes with the claim it carries, once the Store has
// accepted its token (or, with InHandler, once it is well formed and names
// the right lock: the handler's write checks it). A claim is always
// checked and recorded, whatever its method and even with InHandler: the
// read it comes with does not go through the Store, so nothing else would
// raise the record. A claim on a request the server does not fence is
// refused, since passing it would promise a protection nobody gives. With
// Verify set, a token it does not confirm reaches neither a Store's write
// nor the handler, and raises nothing (an EtcdStore's Accept, which
// verifies with the same Verify, refuses it before it writes).
func Check(ctx context.Context, s Store, r Request) (c Claim, fenced bool, err error) {
	if !r.Claim && r.Unchecked {
		return Claim{}, false, nil
	}
	want := r.Lock()
	switch {
	case want == "" && r.Claim:
		return Claim{}, false, r.Bad(fmt.Sprintf("%s on a request this server does not fence", r.ClaimKey))
	case want == "":
		return Claim{}, false, nil
	}
	c, err = r.Read()
	if err == nil && c.Name != want {
		err = r.Bad(fmt.Sprintf("token is for lock %q, this resource is fenced by %q", c.Name, want))
	}
	accept := r.Claim || !r.InHandler
	if err == nil && r.Verify != nil && !(accept && verifiesInAccept(s)) {
		err = r.Verify(ctx, c)
	}
	if err == nil && accept {
		err = s.Accept(ctx, c.Name, c.Token)
	}
	return c, err == nil, err
}

// verifiesInAccept tells a Store whose Accept verifies the token itself
// before it writes anything: an *EtcdStore given a Verifier
// (WithVerifier), whose own Verify is the only one VerifyFunc lets a
// transport put in Request.Verify. Check leaves the verification to it
// rather than ask twice; the verdict and the error are the same. An
// EtcdStore without a Verifier verifies nothing in Accept, so a Verify
// given beside it (a Verification of another Verifier) runs in Check.
func verifiesInAccept(s Store) bool {
	e, ok := s.(*EtcdStore)
	return ok && e.verify != nil
}
