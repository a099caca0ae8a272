package objectfence

import (
	"encoding/json"
	"fmt"
)

// Manifest is the state a Fence keeps in its manifest object: the highest
// token that committed or claimed it, the name of the lock it is fenced
// by, and the caller's payload (a pointer to the current batch, say).
//
// A Manifest returned by Claim or Commit is a base: the next Commit names
// it, and lands only if the manifest is still that very version. One
// returned by Read, or made by hand, is not a base.
type Manifest struct {
	Token int64
	// Lock is the name of the lock whose tokens fence the manifest. It is
	// empty in a manifest written before manifests recorded it; the first
	// Claim records it.
	Lock    string
	Payload []byte
	// Version is the object's version (the S3 ETag) as read or written.
	Version string

	seq  int64    // manifestBody.Seq
	base baseMark // set by Claim and Commit only
}

// baseMark is what a Manifest returned by Claim or Commit was written or
// read with. A Commit writes from it, never from the exported fields, so
// that a caller who edits a returned Manifest cannot change the token, the
// lock or the version the put is conditioned on: such a base is refused.
type baseMark struct {
	key, lock, version string
	token              int64
}

// manifestBody is the manifest object's JSON form. The payload is kept as
// bytes (base64 in JSON): it is the caller's, and opaque here. A manifest
// written before Lock and Seq existed decodes with both empty.
type manifestBody struct {
	Token int64  `json:"token"`
	Lock  string `json:"lock,omitempty"`
	// Seq counts the manifest's writes through a Fence. S3 gives an object
	// written by one put the MD5 of its body as ETag: without a count, a
	// commit that wrote back bytes the manifest had before would bring back
	// that version, and a commit on the base of that version, replaced in
	// between, would land.
	Seq     int64  `json:"seq,omitempty"`
	Payload []byte `json:"payload"`
}

func encodeManifest(m Manifest) []byte {
	b, _ := json.Marshal(manifestBody{Token: m.Token, Lock: m.Lock, Seq: m.seq, Payload: m.Payload}) // cannot fail: fixed types
	return b
}

// decodeManifest reads a manifest object's body; the result has no
// Version and is no base.
func decodeManifest(key string, body []byte) (Manifest, error) {
	var b manifestBody
	if err := json.Unmarshal(body, &b); err != nil || b.Token <= 0 || b.Seq < 0 {
		return Manifest{}, fmt.Errorf("%w: %q holds no manifest of this package", ErrBadManifest, key)
	}
	return Manifest{Token: b.Token, Lock: b.Lock, Payload: b.Payload, seq: b.Seq}, nil
}
