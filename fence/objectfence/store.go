package objectfence

import (
	"context"
	"errors"
)

// Store is the object store a Fence writes through: any store that can put
// an object only if its current version is a given one, or only if it is
// absent. NewS3Store adapts an S3 client; other stores (GCS, Azure Blob,
// minio-go) plug in by implementing it.
type Store interface {
	// Get returns the object's body and its version (the S3 ETag; never
	// empty), or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) (body []byte, version string, err error)
	// Put writes body under key if cond holds, and returns the new version
	// (never empty).
	// A condition that does not hold gives an error wrapping
	// ErrPreconditionFailed, a concurrent conditional write one wrapping
	// ErrConflict, and a request the store refused before applying it one
	// wrapping ErrRefused; any other error leaves the outcome unknown.
	Put(ctx context.Context, key string, body []byte, cond Condition) (version string, err error)
	// Delete removes the object; a missing object is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the keys of the objects whose keys start with prefix.
	List(ctx context.Context, prefix string) ([]string, error)
}

// Condition is what must hold for Store.Put to write. The zero Condition
// writes unconditionally.
type Condition struct {
	// IfMatch: the object exists with this version (S3's If-Match).
	IfMatch string
	// IfAbsent: no object exists under the key (S3's If-None-Match: *).
	IfAbsent bool
}

// Errors a Store returns, wrapped; match them with errors.Is.
var (
	// ErrNotFound reports that no object exists under the key.
	ErrNotFound = errors.New("objectfence: object not found")
	// ErrPreconditionFailed reports a put whose condition did not hold
	// (HTTP 412): nothing was written.
	ErrPreconditionFailed = errors.New("objectfence: precondition failed")
	// ErrConflict reports a conditional put that met a concurrent one
	// (S3's 409 ConditionalRequestConflict): nothing was written.
	ErrConflict = errors.New("objectfence: conflicting conditional write")
	// ErrRefused reports a request the store refused before applying it
	// (no permission, no such bucket, a bad request): nothing was written.
	ErrRefused = errors.New("objectfence: refused by the store")
)
