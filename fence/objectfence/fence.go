package objectfence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
	"unicode/utf8"

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
	// ErrNotClaimed reports a Commit whose base is not the manifest as it
	// is: the base came from Read (or was made by hand), or the manifest
	// has been written since the Claim or Commit that returned the base.
	// The commit's payload is not in the manifest. Claim again, with the
	// same token, to get the manifest as it is now.
	ErrNotClaimed = errors.New("objectfence: not the claimed manifest")
	// ErrOtherLock reports a manifest fenced by another lock than the
	// Fence's. Tokens of different locks do not compare, so nothing was
	// written.
	ErrOtherLock = errors.New("objectfence: manifest fenced by another lock")
)

// DefaultAttempts is how many conditional puts a write makes before it
// gives up with ErrContended, unless WithAttempts says otherwise.
const DefaultAttempts = 16

// Fence commits a manifest object fenced by the tokens of one lock: each
// write records its token and the lock's name in the manifest, a write
// whose token is lower than the manifest's is refused, and a commit lands
// only on the manifest version it names as its base. It holds no
// connection and is safe for concurrent use.
type Fence struct {
	store    Store
	key      string
	lock     string // the name of the lock whose tokens fence the manifest
	data     string // prefix of the data objects
	probe    string // prefix of the probe objects
	attempts int
	hooks    *fence.Hooks

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

// WithHooks reports refused writes ("object") and unknown outcomes to h,
// and each Claim and Commit to its Write hook (guard kind "claim" or
// "manifest", key the manifest's).
func WithHooks(h *fence.Hooks) Option {
	return func(f *Fence) error {
		f.hooks = h
		return nil
	}
}

// New returns a Fence for the manifest object key in store, fenced by the
// tokens of the lock named lock (lease.Lock.Name): the tokens passed to
// Claim must be that lock's. The name is recorded in the manifest, and a
// manifest that records another is neither claimed nor committed. New
// sends nothing: the store's conditions are checked by the first write
// (see Check).
func New(store Store, key, lock string, opts ...Option) (*Fence, error) {
	switch {
	case store == nil:
		return nil, fmt.Errorf("objectfence: %w: nil store", fence.ErrInvalidArgument)
	case key == "":
		return nil, fmt.Errorf("objectfence: %w: empty manifest key", fence.ErrInvalidArgument)
	case lock == "":
		return nil, fmt.Errorf("objectfence: %w: empty lock name", fence.ErrInvalidArgument)
	case !utf8.ValidString(lock):
		// JSON would replace the bad bytes: the name would not read back
		// as written, and every later write would be refused.
		return nil, fmt.Errorf("objectfence: %w: lock name %q is not UTF-8", fence.ErrInvalidArgument, lock)
	}
	f := &Fence{store: store, key: key, lock: lock, data: key + ".data/", probe: key + ".probe-", attempts: DefaultAttempts}
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
// if none was written yet. What it returns is no base for Commit: a holder
// that reads before it writes must Claim instead, since a plain read does
// not keep a lower token out.
func (f *Fence) Read(ctx context.Context) (Manifest, error) {
	m, err := f.read(ctx)
	if err != nil {
		return Manifest{}, failed("read", f.key, err)
	}
	if m == nil {
		return Manifest{}, failed("read", f.key, ErrNotFound)
	}
	return *m, nil
}

// Claim raises the manifest's token to token and records the Fence's lock
// name in it, keeping its payload, and returns it as the base of the
// holder's next Commit. From then on no lower token commits or claims: a
// new holder claims before it reads, so that a commit the previous holder
// still had in flight cannot land after the read. A manifest already at
// token, under the Fence's lock name, is returned as it is, with nothing
// written; a missing one is created with an empty payload. A higher token
// gives a *fence.StaleError naming both, a manifest that records another
// lock name an error wrapping ErrOtherLock. An error wrapping
// fence.ErrOutcomeUnknown means the claim may or may not have been
// written: claim again.
//
// Claiming again with the same token is also how a holder continues after
// any failed Commit: it returns the manifest as it is, whatever landed.
func (f *Fence) Claim(ctx context.Context, token int64) (Manifest, error) {
	ctx, done := f.begin(ctx, "claim", token)
	m, err := f.claim(ctx, token)
	done(err)
	return m, err
}

// begin starts a write for the hooks (fence.Hooks.Begin).
func (f *Fence) begin(ctx context.Context, kind string, token int64) (context.Context, func(error)) {
	return f.hooks.Begin(ctx, "object", "object", func() []fence.WriteGuard {
		return []fence.WriteGuard{{Kind: kind, Key: f.key, Token: token}}
	})
}

func (f *Fence) claim(ctx context.Context, token int64) (Manifest, error) {
	if token <= 0 {
		return Manifest{}, failed("claim", f.key, fmt.Errorf("%w: token %d", fence.ErrInvalidArgument, token))
	}
	if err := f.checkOnce(ctx); err != nil {
		return Manifest{}, failed("claim", f.key, err)
	}
	for attempt := 1; ; attempt++ {
		cur, err := f.read(ctx)
		if err != nil {
			return Manifest{}, failed("claim", f.key, err)
		}
		if err := f.refuse("claim", cur, token); err != nil {
			return Manifest{}, err
		}
		next, cond := Manifest{Token: token, Lock: f.lock}, Condition{IfAbsent: true}
		if cur != nil {
			if cur.Token == token && cur.Lock == f.lock {
				return f.base(*cur), nil
			}
			next.Payload, next.seq, cond = cur.Payload, cur.seq, Condition{IfMatch: cur.Version}
		}
		if err := ctx.Err(); err != nil { // nothing sent: say so
			return Manifest{}, failed("claim", f.key, err)
		}
		m, err := f.put(ctx, next, cond)
		if err == nil {
			return m, nil
		}
		// Refused for a write between the read and the put: read again.
		if err := f.again(ctx, attempt, err); err != nil {
			return Manifest{}, failed("claim", f.key, err)
		}
	}
}

// Commit makes payload the manifest's, with base's token, only if the
// manifest is still base: the Manifest that the holder's Claim, or its
// previous Commit, returned. It returns the new manifest, the base of the
// next Commit.
//
// A Manifest that is no base (from Read, made by hand, or of another
// manifest or lock name) is refused before anything is sent, with an
// error wrapping fence.ErrInvalidArgument and ErrNotClaimed (ErrOtherLock
// for another lock name). If anything was written to the manifest since
// base, nothing is written: a higher token gives a *fence.StaleError
// naming both, a manifest fenced by another lock now an error wrapping
// ErrOtherLock, and anything else (another commit of the same holding,
// or one of its own whose answer was lost) an error wrapping
// ErrNotClaimed.
//
// An error wrapping fence.ErrOutcomeUnknown means the put may or may not
// have been written. The holder goes on with Claim, with the same token,
// which returns the manifest as it is: with payload if the put landed.
// Committing on the same base once more is safe too: at most one of the
// two lands. If the first landed, the second finds it and returns it when
// its payload is the same, and gives ErrNotClaimed when it is not.
func (f *Fence) Commit(ctx context.Context, base Manifest, payload []byte) (Manifest, error) {
	ctx, done := f.begin(ctx, "manifest", base.Token)
	m, err := f.commit(ctx, base, payload)
	done(err)
	return m, err
}

func (f *Fence) commit(ctx context.Context, base Manifest, payload []byte) (Manifest, error) {
	if err := f.isBase(base); err != nil {
		return Manifest{}, failed("commit", f.key, err)
	}
	if err := f.checkOnce(ctx); err != nil {
		return Manifest{}, failed("commit", f.key, err)
	}
	b := base.base
	next := Manifest{Token: b.token, Lock: b.lock, Payload: payload, seq: base.seq}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil { // nothing sent: say so
			return Manifest{}, failed("commit", f.key, err)
		}
		m, err := f.put(ctx, next, Condition{IfMatch: b.version})
		switch {
		case err == nil:
			return m, nil
		case !raced(err):
			return Manifest{}, failed("commit", f.key, err)
		}
		// Refused for its condition: the manifest as it is now says why.
		cur, rerr := f.read(ctx)
		if rerr != nil {
			return Manifest{}, failed("commit", f.key, fmt.Errorf("%w; reading the manifest then: %w", err, rerr))
		}
		if landed(cur, next) {
			// This commit's own put, whose answer was lost below the
			// fence and re-sent (a client that retries), then refused.
			return f.base(*cur), nil
		}
		if err := f.moved(cur, base); err != nil {
			return Manifest{}, err
		}
		// Still base: the put met another conditional put (S3's 409)
		// that has not landed, or not yet; try again.
		if err := f.again(ctx, attempt, err); err != nil {
			return Manifest{}, failed("commit", f.key, err)
		}
	}
}

// isBase tells whether base is one that Claim or Commit returned for this
// manifest and this lock; it sends nothing.
func (f *Fence) isBase(base Manifest) error {
	b := base.base
	switch {
	case b.key == "" || b.version == "":
		return fmt.Errorf("%w: %w: the base did not come from Claim or Commit; claim the manifest and commit on what it returns",
			fence.ErrInvalidArgument, ErrNotClaimed)
	case b.key != f.key:
		return fmt.Errorf("%w: %w: the base is of manifest %q", fence.ErrInvalidArgument, ErrNotClaimed, b.key)
	case base.Token != b.token || base.Version != b.version || base.Lock != b.lock:
		return fmt.Errorf("%w: %w: the base's token, version or lock was changed after Claim or Commit returned it; commit on the Manifest as returned",
			fence.ErrInvalidArgument, ErrNotClaimed)
	case b.lock != f.lock:
		return fmt.Errorf("%w: %w: the base was claimed under %q (this Fence's lock: %q)", fence.ErrInvalidArgument, ErrOtherLock, base.Lock, f.lock)
	}
	return nil
}

// refuse says why token may not write over cur (nil: absent): cur is
// fenced by another lock, or has accepted a higher token. A manifest
// that records no lock name, written before manifests recorded it, is
// compared by token alone, as it was then.
func (f *Fence) refuse(op string, cur *Manifest, token int64) error {
	switch {
	case cur == nil:
		return nil
	case cur.Lock != "" && cur.Lock != f.lock:
		return failed(op, f.key, fmt.Errorf("%w: %q (this Fence's lock: %q)", ErrOtherLock, cur.Lock, f.lock))
	case cur.Token > token:
		return &fence.StaleError{Key: f.key, Token: token, Highest: cur.Token}
	}
	return nil
}

// moved says why a commit on base was refused, given the manifest as it
// is now (nil: absent); nil if it is still base.
func (f *Fence) moved(cur *Manifest, base Manifest) error {
	if err := f.refuse("commit", cur, base.Token); err != nil {
		return err
	}
	switch {
	case cur == nil:
		return failed("commit", f.key, fmt.Errorf("%w: the manifest is gone; claim it again", ErrNotClaimed))
	case cur.Version != base.Version:
		return failed("commit", f.key, fmt.Errorf("%w: it has been written since the base (now version %s, token %d); claim it again",
			ErrNotClaimed, cur.Version, cur.Token))
	}
	return nil
}

// put writes next as the manifest's next version on cond, and returns it
// as a base. A failed condition or a conflict is returned as it is, for
// the caller to decide; a refusal by the store wrote nothing; any other
// error leaves the outcome unknown, and is never retried here.
func (f *Fence) put(ctx context.Context, next Manifest, cond Condition) (Manifest, error) {
	next.seq++
	version, err := f.store.Put(ctx, f.key, encodeManifest(next), cond)
	switch {
	case err == nil && version == "":
		// A base with no version would make the next commit's put
		// unconditional.
		return Manifest{}, fmt.Errorf("%w: the store gave no version for its put", fence.ErrOutcomeUnknown)
	case err == nil && version == cond.IfMatch:
		// next differs from the version it was conditioned on (its count
		// grew): a store that gives the same version to both does not tell
		// contents apart, and no condition on it fences anything.
		return Manifest{}, fmt.Errorf("%w: the store gave the new manifest the version its put was conditioned on (%s)",
			ErrConditionsIgnored, version)
	case err == nil:
		next.Version = version
		return f.base(next), nil
	case raced(err), errors.Is(err, ErrRefused):
		return Manifest{}, err
	}
	return Manifest{}, fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, err)
}

// raced tells whether a put was refused because of another write: its
// condition failed, or it met a concurrent conditional put.
func raced(err error) bool {
	return errors.Is(err, ErrPreconditionFailed) || errors.Is(err, ErrConflict)
}

// again decides whether a write whose put failed with err tries again:
// only for a race, and not past the Fence's attempts.
func (f *Fence) again(ctx context.Context, attempt int, err error) error {
	switch {
	case !raced(err):
		return err
	case attempt >= f.attempts:
		return fmt.Errorf("%w (%d attempts): %w", ErrContended, attempt, err)
	}
	return backoff(ctx, attempt, errors.Is(err, ErrConflict))
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

// base is m as a base of this Fence's manifest.
func (f *Fence) base(m Manifest) Manifest {
	m.base = baseMark{key: f.key, lock: m.Lock, version: m.Version, token: m.Token}
	return m
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
	if version == "" {
		// A put on its If-Match would be unconditional.
		return nil, fmt.Errorf("get %q: the store gave no version", f.key)
	}
	m, err := decodeManifest(f.key, body)
	if err != nil {
		return nil, err
	}
	m.Version = version
	return &m, nil
}

// landed tells whether cur is the manifest that a put of next wrote: the
// write after next's base, with its token, lock and payload.
func landed(cur *Manifest, next Manifest) bool {
	return cur != nil && cur.seq == next.seq+1 && cur.Token == next.Token && cur.Lock == next.Lock &&
		bytes.Equal(cur.Payload, next.Payload)
}
