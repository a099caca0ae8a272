package lease

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

// DefaultTTL is the lease TTL a Session asks for when WithTTL is not given.
const DefaultTTL = 10 * time.Second

// Option configures a Session. Options are checked by NewSession, which
// returns an error wrapping ErrInvalidArgument for a bad one.
type Option func(*options) error

type options struct {
	ttl       time.Duration
	logger    *zap.Logger
	clock     clock     // the real clock unless the fault suite scales it
	seam      faultSeam // empty in release builds
	hooks     Hooks
	keeper    *Keeper
	lockDelay time.Duration
	// owner is WithOwner's; ownerGiven tells it from the default.
	owner      string
	ownerGiven bool
}

// WithTTL sets the lease TTL the session asks for: at least one second,
// rounded up to whole seconds. etcd may grant more (2 s at least with
// default timing); the session uses what it granted (Session.TTL).
func WithTTL(ttl time.Duration) Option {
	return func(o *options) error {
		if ttl < time.Second {
			return fmt.Errorf("%w: ttl %v is below one second", ErrInvalidArgument, ttl)
		}
		o.ttl = ttl
		return nil
	}
}

// WithLogger sets the logger for the session's events (start, grants,
// releases, losses). A nil logger means zap.NewNop().
func WithLogger(l *zap.Logger) Option {
	return func(o *options) error {
		o.logger = l
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	o := options{ttl: DefaultTTL}
	for _, opt := range opts {
		if opt == nil {
			return options{}, fmt.Errorf("%w: nil Option", ErrInvalidArgument)
		}
		if err := opt(&o); err != nil {
			return options{}, err
		}
	}
	if o.logger == nil {
		o.logger = zap.NewNop()
	}
	return o, nil
}

// ttlSeconds rounds a TTL up to whole seconds, as etcd counts them.
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
