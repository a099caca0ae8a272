package objectfence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasefence/leasefence/fence"
)

// Sentinel errors of a Fence; match them with errors.Is.
var (
	// ErrBadManifest reports a manifest object that this package did not
	// write: the Fence neither reads nor overwrites it.
	ErrBadManifest = errors.New("objectfence: bad manifest")
	// ErrConditionsIgnored reports a store that wrote a put whose
	// condition did not hold: a fence on it would let stale writers in.
	ErrConditionsIgnored = errors.New("objectfence: store ignores write conditions")
	// ErrContended reports a write that kept meeting other writers' puts
	// and gave up; nothing of it was written.
	ErrContended = errors.New("objectfence: too many conflicting writes")
)

// DefaultAttempts is how many conditional puts a write makes before it
// gives up with ErrContended, unless WithAttempts says otherwise.
const DefaultAttempts = 16

// Fence commits a manifest object fenced by lock tokens: each commit
// records its token in the manifest, and a commit whose token is lower
// than the manifest's is refused. It holds no connection and is safe for
// concurrent use.
type Fence struct {
	store    Store
	key      string
	data     string // prefix of the data objects
	probe    string // prefix of the probe objects
	attempts int

	// checking is held through a check, so that a Fence's writes that
	// start together run one check between them.
	checking sync.Mutex
	checked  error // nil until a check ends; errChecked once it passed
}

// errChecked marks a check that passed.
var errChecked = errors.New("checked")

// Option configures a Fence.
type Option func(*Fence) error

// WithDataPrefix sets the prefix of the data objects (DataKey, Orphans);
// the default is the manifest key + ".data/".
func WithDataPrefix(prefix string) Option {
	return func(f *Fence) error {
		if prefix == "" {
			return fmt.Errorf("%w: empty data prefix", fence.ErrInvalidArgument)
		}
		f.data = prefix
		return nil
	}
}

// WithProbePrefix sets the prefix of the objects the condition check
// writes and removes (one per check, with a random suffix, so that checks
// of several processes at once do not meet); the default is the manifest
// key + ".probe-".
func WithProbePrefix(prefix string) Option {
	return func(f *Fence) error {
		if prefix == "" {
			return fmt.Errorf("%w: empty probe prefix", fence.ErrInvalidArgument)
		}
		f.probe = prefix
		return nil
	}
}

// WithAttempts sets how many conditional puts a write makes before it
// gives up with ErrContended (DefaultAttempts unless set; at least 1).
func WithAttempts(n int) Option {
	return func(f *Fence) error {
		if n < 1 {
			return fmt.Errorf("%w: %d attempts", fence.ErrInvalidArgument, n)
		}
		f.attempts = n
		return nil
	}
}

// New returns a Fence for the manifest object key in store. It sends
// nothing: the store's conditions are checked by the first write (see
// Check).
func New(store Store, key string, opts ...Option) (*Fence, error) {
	switch {
	case store == nil:
		return nil, fmt.Errorf("objectfence: %w: nil store", fence.ErrInvalidArgument)
	case key == "":
		return nil, fmt.Errorf("objectfence: %w: empty manifest key", fence.ErrInvalidArgument)
	}
	f := &Fence{store: store, key: key, data: key + ".data/", probe: key + ".probe-", attempts: DefaultAttempts}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("objectfence: %w: nil option", fence.ErrInvalidArgument)
		}
		if err := o(f); err != nil {
			return nil, fmt.Errorf("objectfence: %w", err)
		}
	}
	return f, nil
}

// Key is the manifest object's key.
func (f *Fence) Key() string { return f.key }

// Read returns the manifest as it is now, or an error wrapping ErrNotFound
// if none was committed yet. A holder that reads before it writes must
// Claim instead: a plain read does not keep a lower token out.
func (f *Fence) Read(ctx context.Context) (Manifest, error) {
	m, err := f.read(ctx)
	if err != nil {
		return Manifest{}, fmt.Errorf("objectfence: read %q: %w", f.key, err)
	}
	if m == nil {
		return Manifest{}, fmt.Errorf("objectfence: read %q: %w", f.key, ErrNotFound)
	}
	return *m, nil
}

// Commit makes payload the manifest's, with token, if no higher token has
// committed or claimed it: one read and one conditional put, repeated
// only while the manifest's token stays at or below token. A higher token
// gives a *fence.StaleError naming both. An error wrapping
// fence.ErrOutcomeUnknown means the put may or may not have been written:
// read the manifest before trying again.
func (f *Fence) Commit(ctx context.Context, token int64, payload []byte) (Manifest, error) {
	return f.write(ctx, "commit", token, func(*Manifest) ([]byte, bool) { return payload, true })
}

// Claim raises the manifest's token to token, keeping its payload, and
// returns the manifest: from then on no lower token commits. A new holder
// claims before it reads, so that a commit the previous holder still had
// in flight cannot land after the read. A manifest already at token is
// returned as it is, with nothing written; a missing one is created with
// an empty payload. A higher token gives a *fence.StaleError.
func (f *Fence) Claim(ctx context.Context, token int64) (Manifest, error) {
	return f.write(ctx, "claim", token, func(cur *Manifest) ([]byte, bool) {
		if cur == nil {
			return nil, true
		}
		return cur.Payload, cur.Token != token
	})
}

// write reads the manifest and puts next's payload with token, on the
// condition that the manifest is still the one read: any write between
// the read and the put changes its version and fails the put, which is
// then retried from a new read. next says what to write given the
// manifest (nil if absent), or that nothing need be written.
func (f *Fence) write(ctx context.Context, op string, token int64, next func(*Manifest) ([]byte, bool)) (Manifest, error) {
	if token <= 0 {
		return Manifest{}, fmt.Errorf("objectfence: %s %q: %w: token %d", op, f.key, fence.ErrInvalidArgument, token)
	}
	if err := f.checkOnce(ctx); err != nil {
		return Manifest{}, fmt.Errorf("objectfence: %s %q: %w", op, f.key, err)
	}
	for attempt := 1; ; attempt++ {
		cur, err := f.read(ctx)
		if err != nil {
			return Manifest{}, fmt.Errorf("objectfence: %s %q: %w", op, f.key, err)
		}
		if cur != nil && cur.Token > token {
			return Manifest{}, &fence.StaleError{Key: f.key, Token: token, Highest: cur.Token}
		}
		payload, put := next(cur)
		if !put {
			return *cur, nil
		}
		cond := Condition{IfAbsent: true}
		if cur != nil {
			cond = Condition{IfMatch: cur.Version}
		}
		version, err := f.store.Put(ctx, f.key, encodeManifest(token, payload), cond)
		switch {
		case err == nil:
			return Manifest{Token: token, Payload: payload, Version: version}, nil
		case errors.Is(err, ErrPreconditionFailed), errors.Is(err, ErrConflict):
			if attempt >= f.attempts {
				return Manifest{}, fmt.Errorf("objectfence: %s %q: %w (%d attempts): %w", op, f.key, ErrContended, attempt, err)
			}
			if err := backoff(ctx, attempt, errors.Is(err, ErrConflict)); err != nil {
				return Manifest{}, fmt.Errorf("objectfence: %s %q: %w", op, f.key, err)
			}
		case errors.Is(err, ErrRefused):
			return Manifest{}, fmt.Errorf("objectfence: %s %q: %w", op, f.key, err)
		default:
			return Manifest{}, fmt.Errorf("objectfence: %s %q: %w: %w", op, f.key, fence.ErrOutcomeUnknown, err)
		}
	}
}

// backoff waits before another attempt: none after a failed condition
// (the next read is the wait), a short random time after a conflict,
// where the store saw two conditional puts at once.
func backoff(ctx context.Context, attempt int, conflict bool) error {
	if !conflict {
		return ctx.Err()
	}
	d := time.Duration(rand.Int64N(int64(min(attempt, 8)) * int64(5*time.Millisecond)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// read returns the manifest, nil if there is none.
func (f *Fence) read(ctx context.Context) (*Manifest, error) {
	body, version, err := f.store.Get(ctx, f.key)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m, err := decodeManifest(f.key, body)
	if err != nil {
		return nil, err
	}
	return &Manifest{Token: m.Token, Payload: m.Payload, Version: version}, nil
}
