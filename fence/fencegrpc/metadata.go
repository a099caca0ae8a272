package fencegrpc

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"

	"github.com/leasefence/leasefence/fence/fencestore"
)

// Metadata keys of the wire format. gRPC metadata keys are lowercase, and
// the "grpc-" prefix is reserved for gRPC itself.
const (
	MetadataLock  = "leasefence-lock"
	MetadataToken = "leasefence-token"
	// MetadataClaim, sent as "1" with the two fencing keys, asks the server
	// to record the call's token before the handler runs, whatever the
	// method: see WithClaim.
	MetadataClaim = "leasefence-claim"
)

// ErrBadMetadata is wrapped by every error of ParseMetadata: a fencing key
// is missing, repeated or malformed.
var ErrBadMetadata = errors.New("fencegrpc: bad fencing metadata")

// SetMetadata sets the fencing keys for c on md, replacing any there.
func SetMetadata(md metadata.MD, c fencestore.Claim) {
	md.Set(MetadataLock, c.Name)
	md.Set(MetadataToken, fencestore.FormatToken(c.Token))
}

// ParseMetadata reads the fencing keys strictly: each exactly once, the
// token in canonical decimal (fencestore.ParseToken). Every error wraps
// ErrBadMetadata and says which key is wrong and why.
func ParseMetadata(md metadata.MD) (fencestore.Claim, error) {
	name, err := single(md, MetadataLock)
	if err != nil {
		return fencestore.Claim{}, err
	}
	if err := checkName(name); err != nil {
		return fencestore.Claim{}, fmt.Errorf("%w: %s %w", ErrBadMetadata, MetadataLock, err)
	}
	raw, err := single(md, MetadataToken)
	if err != nil {
		return fencestore.Claim{}, err
	}
	token, err := fencestore.ParseToken(raw)
	if err != nil {
		return fencestore.Claim{}, fmt.Errorf("%w: %s %w", ErrBadMetadata, MetadataToken, err)
	}
	return fencestore.Claim{Name: name, Token: token}, nil
}

// claimed reads the claim key: absent is no claim, a single "1" is one.
// Anything else is refused rather than read as no claim, since a client
// that meant to claim would then read unprotected without knowing it.
func claimed(md metadata.MD) (bool, error) {
	for _, k := range []string{MetadataLock, MetadataToken, MetadataClaim} {
		// gRPC decodes a "-bin" key as binary: a client sending one meant
		// the fencing key, and reading it as absent would drop a claim.
		if len(md.Get(k+"-bin")) > 0 {
			return false, fmt.Errorf("%w: %s-bin: fencing keys are sent as text, without the -bin suffix", ErrBadMetadata, k)
		}
	}
	vs := md.Get(MetadataClaim)
	switch {
	case len(vs) == 0:
		return false, nil
	case len(vs) > 1:
		return false, fmt.Errorf("%w: %s given %d times", ErrBadMetadata, MetadataClaim, len(vs))
	case vs[0] != "1":
		return false, fmt.Errorf("%w: %s %.30q: the only value is \"1\"", ErrBadMetadata, MetadataClaim, vs[0])
	}
	return true, nil
}

func single(md metadata.MD, key string) (string, error) {
	vs := md.Get(key)
	switch len(vs) {
	case 0:
		return "", fmt.Errorf("%w: %s is missing", ErrBadMetadata, key)
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("%w: %s given %d times", ErrBadMetadata, key, len(vs))
}

// checkName is fencestore.CheckName narrowed to what gRPC metadata can
// carry: values of keys without the "-bin" suffix are printable ASCII.
func checkName(name string) error {
	if err := fencestore.CheckName(name); err != nil {
		return err
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] > 0x7e {
			return fencestore.Reason(fmt.Sprintf("%q is not printable ASCII, which gRPC metadata requires", name))
		}
	}
	return nil
}
