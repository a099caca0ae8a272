package objectfence

import (
	"context"
	"fmt"
	"strings"

	"github.com/leasefence/leasefence/fence"
)

// DataKey is the key of a data object named name that the holder of token
// writes before it commits a manifest that points at it: the data prefix,
// the token (fence.EncodeToken), "/", and name. No two holders share a
// token, so no other writer ever writes the same key, and the object
// becomes visible only through the manifest that names it.
func (f *Fence) DataKey(token int64, name string) (string, error) {
	switch {
	case token <= 0:
		return "", fmt.Errorf("objectfence: data key: %w: token %d", fence.ErrInvalidArgument, token)
	case name == "":
		return "", fmt.Errorf("objectfence: data key: %w: empty name", fence.ErrInvalidArgument)
	}
	return f.data + fence.EncodeToken(token) + "/" + name, nil
}

// Orphans lists the data objects that no manifest can make visible any
// more, for cleanup: those written under a token lower than the
// manifest's (whose holder's commit would be refused) that referenced
// does not report as named by the current manifest. Objects of the
// manifest's own token or higher are never listed: their holder may still
// commit them. Keys under the data prefix that DataKey did not make are
// left alone. With no manifest yet, nothing is an orphan; a manifest
// fenced by another lock than the Fence's gives an error wrapping
// ErrOtherLock.
func (f *Fence) Orphans(ctx context.Context, referenced func(key string) bool) ([]string, error) {
	if referenced == nil {
		return nil, fmt.Errorf("objectfence: orphans: %w: nil referenced", fence.ErrInvalidArgument)
	}
	m, err := f.read(ctx)
	if err != nil || m == nil {
		if err != nil {
			return nil, failed("orphans", f.data, err)
		}
		return nil, nil
	}
	if m.Lock != "" && m.Lock != f.lock {
		// The data keys carry tokens of the Fence's lock: a token of
		// another lock says nothing about them.
		return nil, failed("orphans", f.data, fmt.Errorf("%w: %q (this Fence's lock: %q)", ErrOtherLock, m.Lock, f.lock))
	}
	keys, err := f.store.List(ctx, f.data)
	if err != nil {
		return nil, failed("orphans", f.data, err)
	}
	var out []string
	for _, k := range keys {
		enc, _, ok := strings.Cut(strings.TrimPrefix(k, f.data), "/")
		token, err := fence.DecodeToken(enc)
		if ok && err == nil && token < m.Token && !referenced(k) {
			out = append(out, k)
		}
	}
	return out, nil
}
