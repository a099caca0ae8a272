package fencehttp

import (
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// Option configures a Middleware.
type Option func(*options) error

type options struct {
	lockName  func(*http.Request) string
	unchecked map[string]bool
	inHandler bool
	lg        *zap.Logger
	hooks     *fence.Hooks
	verifier  fencestore.Verifier
}

// WithLockName makes every checked request carry tokens of the lock name.
func WithLockName(name string) Option {
	return func(o *options) error {
		if err := fencestore.CheckName(name); err != nil {
			return fmt.Errorf("lock name %w", err)
		}
		return WithLockNameFunc(func(*http.Request) string { return name })(o)
	}
}

// WithLockNameFunc decides per request which lock's tokens it must carry, for
// services with a lock per object. An empty name means the request is not
// fenced. f must be safe for concurrent use.
func WithLockNameFunc(f func(*http.Request) string) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("nil lock name func")
		}
		if o.lockName != nil {
			return errors.New("lock name given twice")
		}
		o.lockName = f
		return nil
	}
}

// WithUncheckedMethods sets the HTTP methods that pass without a token. The
// default is GET, HEAD and OPTIONS: reads write nothing. With no methods,
// every request is checked. A claim (HeaderClaim) is checked whatever its
// method: a new holder's first read is what it protects.
func WithUncheckedMethods(methods ...string) Option {
	return func(o *options) error {
		o.unchecked = make(map[string]bool, len(methods))
		for _, m := range methods {
			if m == "" {
				return errors.New("empty method")
			}
			o.unchecked[m] = true
		}
		return nil
	}
}

// WithCheckInHandler leaves the token check to the handler: the middleware
// still refuses bad headers and the wrong lock name, and puts the claim in the
// request's context, but does not consult the Store. The handler must make its
// write through the Store's atomic check (a fence.Txn guarded by
// fencestore.EtcdStore.Guard, or fencestore.MemoryStore.Do) and answer a
// refusal with WriteError. It saves the separate check's round trip; a handler
// that writes any other way writes unfenced. A request carrying HeaderClaim is
// still recorded by the middleware before the handler runs, since a read made
// by the handler does not go through the Store and would record nothing.
func WithCheckInHandler() Option {
	return func(o *options) error {
		o.inHandler = true
		return nil
	}
}

// WithVerifier has the middleware ask v (a fencestore.EtcdVerifier on a
// client of the locks' etcd) before its Store accepts a token higher than
// any it has accepted: a token v does not confirm as the live holder's of the
// lock is answered 403 and raises nothing, and one v cannot check is
// answered 503. A confirmed token is remembered, so a holding costs the
// middleware one read. A fencestore.EtcdStore verifies tokens itself and
// needs no WithVerifier (NewMiddleware refuses one for it).
func WithVerifier(v fencestore.Verifier) Option {
	return func(o *options) error {
		if v == nil {
			return errors.New("nil Verifier")
		}
		o.verifier = v
		return nil
	}
}

// WithLogger logs refused requests at debug level and store failures at warn
// level. nil means no logging.
func WithLogger(lg *zap.Logger) Option {
	return func(o *options) error {
		o.lg = lg
		return nil
	}
}

// WithHooks reports requests refused for a stale token ("http") to h, and
// each fenced or refused request to its Write hook, which may annotate the
// server span.
func WithHooks(h *fence.Hooks) Option {
	return func(o *options) error {
		o.hooks = h
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	o := options{unchecked: map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true}}
	for _, opt := range opts {
		if opt == nil {
			return options{}, fmt.Errorf("fencehttp: %w: nil Option", fence.ErrInvalidArgument)
		}
		if err := opt(&o); err != nil {
			return options{}, fmt.Errorf("fencehttp: %w: %w", fence.ErrInvalidArgument, err)
		}
	}
	if o.lockName == nil {
		return options{}, fmt.Errorf("fencehttp: %w: no lock name: give WithLockName or WithLockNameFunc (a name chosen by the client would pass any fence)", fence.ErrInvalidArgument)
	}
	if o.lg == nil {
		o.lg = zap.NewNop()
	}
	return o, nil
}
