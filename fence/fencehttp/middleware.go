package fencehttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// Middleware checks the fencing headers of requests against a Store before
// they reach the handler. It is safe for concurrent use.
type Middleware struct {
	store  fencestore.Store
	opts   options
	verify func(context.Context, fencestore.Claim) error // nil: tokens are not verified
}

// NewMiddleware returns a Middleware over store. A lock name option is
// required: the server, not the client, decides which lock fences what.
func NewMiddleware(store fencestore.Store, opts ...Option) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("fencehttp: %w: nil Store", fence.ErrInvalidArgument)
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	verify, err := fencestore.VerifyFunc(store, o.verifier)
	if err != nil {
		return nil, fmt.Errorf("fencehttp: %w", err)
	}
	return &Middleware{store: store, opts: o, verify: verify}, nil
}

type claimKey struct{}

// ClaimFrom returns the claim the middleware accepted for the request whose
// context ctx is.
func ClaimFrom(ctx context.Context) (fencestore.Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(fencestore.Claim)
	return c, ok
}

// Wrap returns next behind the fence. A checked request reaches next only
// with both headers well formed, the lock name the server expects, and a
// token the Store accepted (which it then records; with WithCheckInHandler
// the handler's write does this). A request carrying HeaderClaim is always
// checked, and its token recorded by the Store before next runs, whatever
// its method and even with WithCheckInHandler; a claim on a request the
// server does not fence is refused. Otherwise the answer is
// 400 (bad or missing header, wrong lock), 409 (stale token), 403 (a token
// the verifier did not confirm, see WithVerifier) or 503 (the Store or the
// verifier could not answer), and next does not run.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, fenced, err := m.check(r)
		switch {
		case err != nil:
			m.refuse(w, r, c, err)
		case fenced:
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimKey{}, c)))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// check decides whether r is fenced and, if it is, whether it may pass.
// The claim header is read first: a malformed one must not turn a claim
// into an unchecked read that the client believes protected.
func (m *Middleware) check(r *http.Request) (fencestore.Claim, bool, error) {
	claim, err := claimed(r.Header)
	if err != nil {
		m.opts.hooks.Checked(r.Context(), "http", fence.RequestGuard("", 0, true), err)
		return fencestore.Claim{}, false, err
	}
	c, fenced, err := fencestore.Check(r.Context(), m.store, fencestore.Request{
		Claim:     claim,
		Unchecked: m.opts.unchecked[r.Method],
		Lock:      func() string { return m.opts.lockName(r) },
		Read:      func() (fencestore.Claim, error) { return ParseHeaders(r.Header) },
		InHandler: m.opts.inHandler,
		ClaimKey:  HeaderClaim,
		Bad:       func(reason string) error { return fmt.Errorf("%w: %s", ErrBadHeader, reason) },
		Verify:    m.verify,
	})
	if fenced || err != nil {
		m.opts.hooks.Checked(r.Context(), "http", fence.RequestGuard(c.Name, c.Token, claim), err)
	}
	return c, fenced, err
}

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, c fencestore.Claim, err error) {
	if _, stale := isStale(err); stale || errors.Is(err, fence.ErrUnverified) {
		m.opts.hooks.Report("http", err)
	}
	status := WriteError(w, c, err)
	lg := m.opts.lg.With(zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Int("status", status), zap.Error(err))
	if status == http.StatusServiceUnavailable {
		lg.Warn("fence store failed")
	} else {
		lg.Debug("request refused")
	}
}

// refusal is the JSON body of a refused request.
type refusal struct {
	Error   string `json:"error"`
	Lock    string `json:"lock,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Highest int64  `json:"highest,omitempty"`
	// Revision: etcd's revision when it did not confirm the token (403).
	Revision int64 `json:"revision,omitempty"`
}

// WriteError answers a request under claim c that failed with err, as the
// middleware does, and returns the status written: 409 with both tokens for
// a *fence.StaleError, 403 with etcd's revision for a
// *fence.UnverifiedError, 400 for ErrBadHeader or fence.ErrInvalidArgument,
// 503 otherwise. Handlers use it when their own fenced write is refused.
func WriteError(w http.ResponseWriter, c fencestore.Claim, err error) int {
	body := refusal{Error: err.Error(), Lock: c.Name, Token: c.Token}
	status := http.StatusServiceUnavailable
	var ue *fence.UnverifiedError
	if se, ok := isStale(err); ok {
		status = http.StatusConflict
		body.Highest = se.Highest
		body.Error = fmt.Sprintf("stale fencing token %d for lock %q: token %d already accepted", c.Token, c.Name, se.Highest)
		w.Header().Set(HeaderHighest, strconv.FormatInt(se.Highest, 10))
		w.Header().Set(HeaderLock, c.Name)
	} else if errors.As(err, &ue) {
		status = http.StatusForbidden
		body.Revision = ue.Revision
		w.Header().Set(HeaderRevision, strconv.FormatInt(ue.Revision, 10))
		w.Header().Set(HeaderLock, ue.Name)
	} else if errors.Is(err, ErrBadHeader) || errors.Is(err, fence.ErrInvalidArgument) {
		status = http.StatusBadRequest
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body) // the client may have gone; nothing to do then
	return status
}

func isStale(err error) (*fence.StaleError, bool) {
	var se *fence.StaleError
	return se, errors.As(err, &se)
}
