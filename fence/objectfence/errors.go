package objectfence

import (
	"fmt"
	"strings"
)

// opError is "objectfence: <op>: <cause>", with this package's sentinels
// in the cause stripped of their own "objectfence: ", so that a message
// names the package once.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "objectfence: " + e.op + ": " + unprefixed.Replace(e.err.Error())
}

func (e *opError) Unwrap() error { return e.err }

// failed is err as the error of op on the object key.
func failed(op, key string, err error) error {
	return &opError{op: fmt.Sprintf("%s %q", op, key), err: err}
}

// unprefixed takes "objectfence: " out of the texts of the package's
// sentinels, and nothing else: a key may hold anything.
var unprefixed = func() *strings.Replacer {
	var pairs []string
	for _, s := range []error{ErrBadManifest, ErrConditionsIgnored, ErrContended, ErrNotClaimed, ErrOtherLock,
		ErrNotFound, ErrPreconditionFailed, ErrConflict, ErrRefused} {
		pairs = append(pairs, s.Error(), strings.TrimPrefix(s.Error(), "objectfence: "))
	}
	return strings.NewReplacer(pairs...)
}()
