package objectfence_test

// A Commit's base must be one that Claim or Commit returned: a base whose
// fields were altered is refused, or its put fails its condition, and the
// manifest's token never goes down. Each names the promise of doc.go it
// checks.

import (
	"errors"
	"testing"

	"github.com/leasefence/leasefence/fence"
)

// doc.go: "Bad input (... a Commit on a Manifest that Claim or Commit did
// not return ...) is refused ... before anything is sent" and "A Claim or
// Commit whose token is lower than one the manifest has accepted never
// lands". A base whose exported Version was cleared must not become an
// unconditional put, which would let token 5 overwrite the manifest after
// token 7 claimed and committed it.
func TestCommitOnBaseWithoutVersionIsRefused(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b5 := mustClaim(t, f, 5)
	mustCommit(t, f, 7, "seven")
	b5.Version = ""
	_, err := f.Commit(ctx, b5, []byte("stale five"))
	m, _ := f.Read(ctx)
	if err == nil || m.Token != 7 {
		t.Fatalf("commit of token 5 on a base with no version: err=%v; manifest now token %d payload %q (token 7 had committed)",
			err, m.Token, m.Payload)
	}
}

// The "obvious fix" after ErrNotClaimed/Stale: copy the current Version
// from Read into an old base. The put's If-Match then holds: were it all
// that guarded the put, the manifest's token would go down from 7 to 5,
// the old holder's Claim(5) would succeed with nothing written, and it
// could keep committing.
func TestCommitOnPatchedBaseIsRefused(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b5 := mustClaim(t, f, 5)
	mustCommit(t, f, 7, "seven")
	_, err := f.Commit(ctx, b5, []byte("x"))
	wantStale(t, err, 5, 7)
	r, err := f.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b5.Version = r.Version
	_, err = f.Commit(ctx, b5, []byte("stale five"))
	m, _ := f.Read(ctx)
	if err == nil || m.Token != 7 {
		t.Fatalf("commit of token 5 on a patched base: err=%v; manifest now token %d payload %q", err, m.Token, m.Payload)
	}
}

// doc.go: "a token below 1 ... is refused with an error wrapping
// fence.ErrInvalidArgument before anything is sent". Commit takes its
// token from base.Token: unchecked, token 0 would be written, and the
// manifest could no longer be read, claimed or committed by anyone (a
// manifest with a token below 1 does not decode).
func TestCommitOnBaseWithZeroTokenIsInvalid(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b := mustClaim(t, f, 5)
	b.Token = 0
	_, err := f.Commit(ctx, b, []byte("p"))
	if !errors.Is(err, fence.ErrInvalidArgument) {
		_, rerr := f.Read(ctx)
		_, cerr := f.Claim(ctx, 9)
		t.Fatalf("commit with token 0: err=%v (want ErrInvalidArgument); then read: %v; claim(9): %v", err, rerr, cerr)
	}
}
