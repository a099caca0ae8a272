package leasetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Server is one embedded etcd member for one test. Its methods are safe for
// concurrent use; each takes the testing.TB it reports failures to.
type Server struct {
	m *member
}

// Option configures NewServer. Make one with WithElectionTimeout or
// WithLogger. Its method is unexported so that how the server is
// configured stays out of this package's API, free to change.
type Option interface {
	apply(*config) error
}

// config is what the options set.
type config struct {
	tickMs, electionMs uint // 0: etcd's defaults
	logger             *zap.Logger
}

// optionFunc makes a function an Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// WithElectionTimeout sets the member's election timeout (etcd's default
// is 1 s), and its heartbeat to a tenth of it. etcd grants no lease shorter
// than 1.5 × the election timeout, rounded up to a second: 500 ms allows
// 1 s leases, for faster loss tests.
func WithElectionTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 50*time.Millisecond || d > time.Minute {
			return fmt.Errorf("leasetest: election timeout %v: want 50ms to 1m", d)
		}
		c.electionMs = uint(d / time.Millisecond)
		c.tickMs = max(c.electionMs/10, 5)
		return nil
	})
}

// WithLogger sends the server's logs to l; by default they are discarded.
func WithLogger(l *zap.Logger) Option {
	return optionFunc(func(c *config) error {
		c.logger = l
		return nil
	})
}

// NewServer starts an embedded etcd member on free loopback ports and stops
// it, removing its data, when the test ends. It fails the test if the
// server cannot start within 30 s or an option is bad. It ignores
// ETCD_ENDPOINTS: the server is always the test's own.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, opt := range opts {
		if opt == nil {
			t.Fatal("leasetest: nil Option")
		}
		if err := opt.apply(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := startMember(ctx, cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stop)
	return &Server{m: m}
}

// Endpoints are the server's client URLs.
func (s *Server) Endpoints() []string { return []string{s.m.endpoint} }

// Client opens a client of the server, closed when the test ends.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := newClient(s.Endpoints(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// RevokeLease revokes a lease, as an operator or an expiry would end it:
// every key attached to it goes at once. The session's locks end at once
// with an error wrapping lease.ErrLost (usually lease.ErrKeyDeleted: the
// deletion of their keys reaches them before the session's next
// keep-alive), and the session ends with lease.ErrLeaseExpired once it
// learns the lease is gone, within a third of its TTL, or at once if it
// sends a request on the lease. A lease already gone is not an error.
func (s *Server) RevokeLease(t testing.TB, id clientv3.LeaseID) {
	t.Helper()
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("leasetest: revoke lease %x: %v", int64(id), err)
	}
}

// DeleteKey deletes a key, as an operator or a buggy client would: a lock
// whose key it was ends with lease.ErrKeyDeleted.
func (s *Server) DeleteKey(t testing.TB, key string) {
	t.Helper()
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatalf("leasetest: delete %q: %v", key, err)
	}
}

// Stop stops the server, keeping its data: clients see it unreachable.
// Stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.m.stop()
}

// Restart starts a stopped server again on the same ports and data, and
// waits until it serves. Leases survive a restart (etcd extends them by
// the election timeout), so a session kept alive through the outage goes
// on.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.m.restart(ctx); err != nil {
		t.Fatalf("leasetest: restart: %v", err)
	}
}
