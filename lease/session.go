package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Session is one etcd lease, kept alive for as long as the session lives,
// under which any number of locks are held. All methods are safe for
// concurrent use.
//
// The session keeps its own conservative view of when the lease ends: the
// time each keep-alive was sent plus the TTL etcd granted. Because etcd
// renews a lease no earlier than it receives the request, that local
// deadline falls before the server's expiry (clocks running at the same
// rate), so Done closes before etcd can hand the session's locks to anyone
// else, even if the network is silent. This is an early warning only: a
// paused process sees nothing until it runs again, which is why writes must
// be fenced.
type Session struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	lg     *zap.Logger
	clock  clock
	seam   faultSeam // empty in release builds; see mutants_off.go

	// ctx ends, with the reason as its cause, when the lease is lost or the
	// session is closed. Every lock's own context derives from it.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	closed   bool
	deadline time.Time
	gates    map[string]*gate

	wg sync.WaitGroup // the keep-alive loop and every lock monitor
}

// gate makes locks of one name taken through one session exclusive locally:
// they share one etcd key, so etcd alone cannot tell them apart.
type gate struct {
	ch   chan struct{}
	refs int
}

// NewSession grants a lease with the configured TTL and keeps it alive until
// Close, or until it is lost. ctx bounds the grant only; an unreachable etcd
// gives an error when ctx ends, so pass a ctx with a deadline.
//
// Bad options or a nil client give an error wrapping ErrInvalidArgument,
// before anything is sent.
func NewSession(ctx context.Context, client *clientv3.Client, opts ...Option) (*Session, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil etcd client", ErrInvalidArgument)
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	sent := o.clock.Now()
	resp, err := client.Grant(ctx, ttlSeconds(o.ttl))
	if err != nil {
		return nil, fmt.Errorf("lease: grant: %w", err)
	}
	granted := o.grantedTTL(resp.TTL)
	s := &Session{
		client:   client,
		id:       resp.ID,
		ttl:      granted,
		lg:       o.logger.With(zap.String("lease", fmt.Sprintf("%x", int64(resp.ID)))),
		clock:    o.clock,
		seam:     o.seam,
		deadline: sent.Add(granted),
		gates:    make(map[string]*gate),
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.wg.Add(1)
	go s.keepAlive()
	s.lg.Debug("session started", zap.Duration("ttl", granted))
	return s, nil
}

// Lease is the etcd lease ID of the session. It identifies the session's
// keys; it is not a fencing token (lease IDs are not ordered).
func (s *Session) Lease() clientv3.LeaseID { return s.id }

// TTL is the lease TTL etcd granted, which may exceed the one asked for.
func (s *Session) TTL() time.Duration { return s.ttl }

// Client is the etcd client the session uses.
func (s *Session) Client() *clientv3.Client { return s.client }

// Done is closed when the session's lease is gone: expired, revoked, not
// renewed before the local deadline, or closed by Close.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err is nil while the session is alive. After Done is closed it says why:
// ErrSessionClosed after Close, an error wrapping ErrLeaseExpired (and so
// ErrLost) otherwise.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Deadline is the session's current conservative view of when its lease
// ends unless renewed: the send time of the last acknowledged keep-alive plus
// the granted TTL.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Close stops the keep-alives and revokes the lease, which releases every
// lock of the session at once: their Done channels close with
// ErrSessionClosed. It waits for every goroutine of the session to stop.
// The revoke is bounded by the TTL (past it the lease has expired anyway).
// A second Close returns ErrSessionClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel(ErrSessionClosed)
	s.wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	if _, err := s.client.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("lease: revoke: %w", err)
	}
	return nil
}

// lose ends the session because its lease is gone.
func (s *Session) lose(reason string) {
	if s.ctx.Err() != nil {
		return
	}
	s.lg.Warn("lease lost", zap.String("reason", reason))
	s.cancel(fmt.Errorf("%w: %s", ErrLeaseExpired, reason))
}

// keepAlive renews the lease over one LeaseKeepAlive stream, every third of
// the TTL, and ends the session when the local deadline passes without a
// renewal. Responses come back in the order the requests were sent, so each
// one is matched to its send time.
func (s *Session) keepAlive() {
	defer s.wg.Done()
	expiry := s.clock.NewTimer(s.untilDeadline())
	defer expiry.Stop()
	retry := 50 * time.Millisecond
	for s.ctx.Err() == nil {
		err := s.keepAliveStream(expiry)
		if s.ctx.Err() != nil {
			return
		}
		s.lg.Debug("keep-alive stream ended", zap.Error(err))
		wait := s.clock.NewTimer(retry)
		select {
		case <-wait.C():
		case <-expiry.C():
			wait.Stop()
			s.lose("not renewed before the local deadline")
			return
		case <-s.ctx.Done():
		}
		wait.Stop()
		retry = min(2*retry, s.ttl/6)
	}
}

type keepAliveResult struct {
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// keepAliveStream runs one stream until it fails or the session ends.
func (s *Session) keepAliveStream(expiry timer) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
	defer cancel()
	stream, err := pb.NewLeaseClient(s.client.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		return err
	}
	results := make(chan keepAliveResult, 1)
	var recv sync.WaitGroup
	recv.Add(1)
	go func() {
		defer recv.Done()
		for {
			resp, err := stream.Recv()
			select {
			case results <- keepAliveResult{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer recv.Wait()
	defer cancel()

	interval := s.ttl / 3
	tick := s.clock.NewTimer(0)
	defer tick.Stop()
	var sent []time.Time // send times of requests not yet answered
	for {
		select {
		case <-tick.C():
			now := s.clock.Now()
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(s.id)}); err != nil {
				return err
			}
			sent = append(sent, now)
			tick.Reset(interval)
		case r := <-results:
			if r.err != nil {
				return r.err
			}
			if len(sent) == 0 {
				return errors.New("keep-alive answer without a request")
			}
			at := sent[0]
			sent = sent[1:]
			if r.resp.TTL <= 0 {
				s.lose("etcd reports the lease gone")
				return nil
			}
			s.extend(at.Add(s.renewedTTL(r.resp.TTL)), expiry)
		case <-expiry.C():
			s.lose("not renewed before the local deadline")
			return nil
		case <-s.ctx.Done():
			return nil
		}
	}
}

func (s *Session) extend(deadline time.Time, expiry timer) {
	s.mu.Lock()
	if deadline.After(s.deadline) {
		s.deadline = deadline
	}
	s.mu.Unlock()
	expiry.Reset(s.untilDeadline())
}

func (s *Session) untilDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.deadline.Sub(s.clock.Now()), 0)
}

// enter takes the local gate of name, waiting for it unless try is set. The
// returned function gives it back.
func (s *Session) enter(ctx context.Context, name string, try bool) (func(), error) {
	s.mu.Lock()
	if s.closed || s.ctx.Err() != nil {
		s.mu.Unlock()
		return nil, context.Cause(s.ctx)
	}
	g := s.gates[name]
	if g == nil {
		g = &gate{ch: make(chan struct{}, 1)}
		s.gates[name] = g
	}
	g.refs++
	s.mu.Unlock()

	leave := func() {
		s.mu.Lock()
		if g.refs--; g.refs == 0 {
			delete(s.gates, name)
		}
		s.mu.Unlock()
	}
	release := func() {
		<-g.ch
		leave()
	}
	if try {
		select {
		case g.ch <- struct{}{}:
			return release, nil
		default:
			leave()
			return nil, ErrLocked
		}
	}
	select {
	case g.ch <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	case <-s.ctx.Done():
		leave()
		return nil, context.Cause(s.ctx)
	}
}

// bound returns ctx, also cancelled when the session ends.
func (s *Session) bound(ctx context.Context) (context.Context, func()) {
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	return bctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// track registers a goroutine with the session so that Close waits for it.
// It fails once the session has ended.
func (s *Session) track() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	s.wg.Add(1)
	return nil
}
