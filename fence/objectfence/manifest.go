package objectfence

import (
	"encoding/json"
	"fmt"
)

// Manifest is the state a Fence keeps in its manifest object: the highest
// token that committed or claimed it, and the caller's payload (a pointer
// to the current batch, say).
type Manifest struct {
	Token   int64
	Payload []byte
	// Version is the object's version (the S3 ETag) as read or written;
	// empty for a manifest that does not exist yet.
	Version string
}

// manifestBody is the manifest object's JSON form. The payload is kept as
// bytes (base64 in JSON): it is the caller's, and opaque here.
type manifestBody struct {
	Token   int64  `json:"token"`
	Payload []byte `json:"payload"`
}

func encodeManifest(token int64, payload []byte) []byte {
	b, _ := json.Marshal(manifestBody{Token: token, Payload: payload}) // cannot fail: fixed types
	return b
}

func decodeManifest(key string, body []byte) (manifestBody, error) {
	var m manifestBody
	if err := json.Unmarshal(body, &m); err != nil || m.Token <= 0 {
		return manifestBody{}, fmt.Errorf("%w: %q holds no manifest of this package", ErrBadManifest, key)
	}
	return m, nil
}
