package fencegrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// Option configures a Checker.
type Option func(*options) error

type options struct {
	lockName  func(ctx context.Context, fullMethod string, req any) string
	unchecked map[string]bool
	inHandler bool
	lg        *zap.Logger
	hooks     *fence.Hooks
	verifier  fencestore.Verifier
}

// WithLockName makes every checked call carry tokens of the lock name,
// which must be printable ASCII (gRPC metadata carries nothing else).
func WithLockName(name string) Option {
	return func(o *options) error {
		if err := checkName(name); err != nil {
			return fmt.Errorf("lock name %w", err)
		}
		return WithLockNameFunc(func(context.Context, string, any) string { return name })(o)
	}
}

// WithLockNameFunc decides per call which lock's tokens it must carry,
// from its full method name ("/package.Service/Method") and, for a unary
// call, its request; a stream is checked when it opens, before any message,
// so req is nil for streams. An empty name means the call is not fenced:
// selector-style matching is a function of fullMethod that returns "" for
// the methods to skip. f must be safe for concurrent use.
func WithLockNameFunc(f func(ctx context.Context, fullMethod string, req any) string) Option {
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

// WithUncheckedMethods sets the methods, by full name
// ("/package.Service/Method"), that pass without a token: reads that write
// nothing, health checks. By default every method is checked. A claim
// (WithClaim) is checked whatever its method: a new holder's first read is
// what it protects.
func WithUncheckedMethods(fullMethods ...string) Option {
	return func(o *options) error {
		o.unchecked = make(map[string]bool, len(fullMethods))
		for _, m := range fullMethods {
			service, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
			if !strings.HasPrefix(m, "/") || !ok || service == "" || method == "" || strings.Contains(method, "/") {
				return fmt.Errorf("method %q is not a full method name like \"/package.Service/Method\"", m)
			}
			o.unchecked[m] = true
		}
		return nil
	}
}

// WithCheckInHandler leaves the token check to the handler: the
// interceptors still refuse bad metadata and the wrong lock name, and put
// the claim in the call's context, but do not consult the Store. The
// handler must make its write through the Store's atomic check (a fence.Txn
// guarded by fencestore.EtcdStore.Guard, or fencestore.MemoryStore.Do) and
// answer a refusal with Error. It saves the separate check's round trip; a
// handler that writes any other way writes unfenced. A claim is still
// recorded by the interceptor before the handler runs, since a read made
// by the handler does not go through the Store and would record nothing.
func WithCheckInHandler() Option {
	return func(o *options) error {
		o.inHandler = true
		return nil
	}
}

// WithVerifier has the Checker ask v (a fencestore.EtcdVerifier on a
// client of the locks' etcd) before its Store accepts a token higher than
// any it has accepted: a call whose token v does not confirm as a live
// holding of the lock fails with PermissionDenied and raises nothing, and
// one v cannot check fails with Unavailable. A confirmed token is
// remembered, so a holding costs the Checker one read. A
// fencestore.EtcdStore verifies tokens itself and needs no WithVerifier
// (NewChecker refuses one for it).
func WithVerifier(v fencestore.Verifier) Option {
	return func(o *options) error {
		if v == nil {
			return errors.New("nil Verifier")
		}
		o.verifier = v
		return nil
	}
}

// WithLogger logs refused calls at debug level and Store failures at warn
// level. nil means no logging.
func WithLogger(lg *zap.Logger) Option {
	return func(o *options) error {
		o.lg = lg
		return nil
	}
}

// WithHooks reports calls refused for a stale token ("grpc") to h, and each
// fenced or refused call to its Write hook, which may annotate the server
// span.
func WithHooks(h *fence.Hooks) Option {
	return func(o *options) error {
		o.hooks = h
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return options{}, fmt.Errorf("fencegrpc: %w: nil Option", fence.ErrInvalidArgument)
		}
		if err := opt(&o); err != nil {
			return options{}, fmt.Errorf("fencegrpc: %w: %w", fence.ErrInvalidArgument, err)
		}
	}
	if o.lockName == nil {
		return options{}, fmt.Errorf("fencegrpc: %w: no lock name: give WithLockName or WithLockNameFunc (a name chosen by the client would pass any fence)", fence.ErrInvalidArgument)
	}
	if o.lg == nil {
		o.lg = zap.NewNop()
	}
	return o, nil
}
