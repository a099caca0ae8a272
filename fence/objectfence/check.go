package objectfence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// mismatch is a version no object has: a well-formed ETag that is not the
// MD5 of anything the probe writes.
const mismatch = `"00000000000000000000000000000000"`

// Check proves, with a probe object of its own (WithProbePrefix), that
// the store honours the conditions a Fence relies on: it refuses a put
// whose If-Match does not match, on a missing object and on an existing
// one, and one with If-None-Match: * on an existing object, and it writes
// one whose If-Match does match. A store that writes any put it should
// have refused gives an error wrapping ErrConditionsIgnored that names the
// put. The probe object is removed after. The first Commit or Claim of a
// Fence runs Check once; a store found to ignore conditions is refused by
// every later write of that Fence.
func (f *Fence) Check(ctx context.Context) error {
	f.checking.Lock()
	defer f.checking.Unlock()
	if err := f.checkLocked(ctx); err != nil {
		return failed("check", f.key, err)
	}
	return nil
}

// checkOnce runs Check unless it has ended before with an answer (passed,
// or found the conditions ignored); a check that failed otherwise (the
// store unreachable, say) is tried again by the next write.
func (f *Fence) checkOnce(ctx context.Context) error {
	f.checking.Lock()
	defer f.checking.Unlock()
	switch f.checked {
	case errChecked:
		return nil
	case nil:
		return f.checkLocked(ctx)
	}
	return fmt.Errorf("check: %w", f.checked)
}

// checkLocked runs the probe and keeps its answer. f.checking is held.
func (f *Fence) checkLocked(ctx context.Context) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := f.probe + hex.EncodeToString(b[:])
	err := f.check(ctx, key)
	switch {
	case err == nil:
		f.checked = errChecked
		return nil
	case errors.Is(err, ErrConditionsIgnored):
		f.checked = err
	}
	return fmt.Errorf("probe %q: %w", key, err)
}

// check runs the probe's puts in order; each step after the first needs
// the one before to have behaved.
func (f *Fence) check(ctx context.Context, k string) error {
	s := f.store
	if err := s.Delete(ctx, k); err != nil {
		return err
	}
	// Removed whatever happens: a failed removal leaves only the probe's
	// own object, and the check's answer is what matters.
	defer func() { _ = s.Delete(context.WithoutCancel(ctx), k) }()
	if _, err := s.Put(ctx, k, []byte("probe 1"), Condition{IfMatch: mismatch}); err == nil {
		return fmt.Errorf("%w: it wrote a put with If-Match on a missing object", ErrConditionsIgnored)
	} else if !refusedByCondition(err) {
		return err
	}
	v1, err := s.Put(ctx, k, []byte("probe 2"), Condition{IfAbsent: true})
	if err != nil {
		return fmt.Errorf("a put with If-None-Match: * on a missing object: %w", err)
	}
	if _, err := s.Put(ctx, k, []byte("probe 3"), Condition{IfAbsent: true}); err == nil {
		return fmt.Errorf("%w: it wrote a put with If-None-Match: * on an existing object", ErrConditionsIgnored)
	} else if !refusedByCondition(err) {
		return err
	}
	if _, err := s.Put(ctx, k, []byte("probe 4"), Condition{IfMatch: mismatch}); err == nil {
		return fmt.Errorf("%w: it wrote a put whose If-Match does not match", ErrConditionsIgnored)
	} else if !refusedByCondition(err) {
		return err
	}
	v2, err := s.Put(ctx, k, []byte("probe 5"), Condition{IfMatch: v1})
	if err != nil {
		return fmt.Errorf("a put whose If-Match matches: %w", err)
	}
	return replaced(ctx, s, k, v1, v2)
}

// replaced checks that the version v1 is gone once v2 replaced it: v2 is
// another version, and a put conditioned on v1 is refused. A store whose
// versions do not tell contents apart (one derived from the size, say)
// would let a commit on a replaced base land.
func replaced(ctx context.Context, s Store, k, v1, v2 string) error {
	if v2 == v1 {
		return fmt.Errorf("%w: it gave two contents the same version %s", ErrConditionsIgnored, v1)
	}
	if _, err := s.Put(ctx, k, []byte("probe 6"), Condition{IfMatch: v1}); err == nil {
		return fmt.Errorf("%w: it wrote a put whose If-Match names a replaced version", ErrConditionsIgnored)
	} else if !refusedByCondition(err) {
		return err
	}
	return nil
}

// refusedByCondition tells whether a put was refused for its condition;
// S3 answers an If-Match on a missing object with 404.
func refusedByCondition(err error) bool {
	return errors.Is(err, ErrPreconditionFailed) || errors.Is(err, ErrNotFound)
}
