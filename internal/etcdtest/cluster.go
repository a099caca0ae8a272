// Package etcdtest starts real etcd servers for tests and examples: one or
// three embedded members on free loopback ports, or the cluster named in the
// ETCD_ENDPOINTS environment variable. It holds only what needs the
// embedded server (members stopped, restarted, held mid-apply or restored
// from a snapshot, and the leak ignores that server's goroutines need);
// the rest of the harness (Name, Ctx, clients, Env's run, the fault
// proxy) is package etcdproc's.
//
// Nothing here is mocked: the servers are etcd's own server package, run in
// process, with fsync on (unless Config.NoFsync). Every server this package
// starts is stopped by Cluster.Close, and every data directory is removed.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config says what to start. The zero value is one member with etcd's
// default timing.
type Config struct {
	// Members is 1 or 3; 0 means 1.
	Members int
	// Dir holds the members' data; empty means a fresh temporary directory
	// that Close removes.
	Dir string
	// TickMs and ElectionMs override etcd's heartbeat and election timeout
	// (100 ms and 1000 ms). The shortest lease etcd grants is
	// 1.5 × ElectionMs, rounded up to a whole second.
	TickMs, ElectionMs uint
	// Logger receives the servers' logs; nil discards them.
	Logger *zap.Logger
	// ClientTLS, if set, makes the client port speak TLS only (https)
	// with these files; with ClientCertAuth set, a client must present a
	// certificate signed by TrustedCAFile. See GenerateCerts.
	ClientTLS *transport.TLSInfo
	// PeerProxies puts etcd's fault proxy (etcdproc.Proxy) in front of
	// each member's peer port (the members reach each other only through
	// them), so that a member can be cut off from the others with
	// Member.PeerProxy.
	PeerProxies bool
	// NoFsync turns off etcd's fsync of its log and database
	// (--unsafe-no-fsync): what benchmarks use to measure the protocol's
	// own cost, without the disk's noise. Never for data that matters.
	NoFsync bool
}

// Member is one embedded etcd server.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string

	cfg       *embed.Config
	mu        sync.Mutex
	etc       *embed.Etcd     // nil while stopped
	peerProxy *etcdproc.Proxy // nil unless Config.PeerProxies
}

// PeerProxy is the proxy in front of the member's peer port, or nil if the
// cluster was started without PeerProxies. Blackholing it cuts the member
// off: others' messages to it and its answers over their connections are
// dropped.
func (m *Member) PeerProxy() *etcdproc.Proxy { return m.peerProxy }

// Cluster is a running etcd cluster: embedded members, or external endpoints.
type Cluster struct {
	Members   []*Member // empty for an external cluster
	endpoints []string
	tmpDir    string
}

// Start starts an embedded cluster and waits until every member serves
// requests, or ctx ends.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	return start(ctx, cfg, nil)
}

// start is Start, with tb (if not nil) to receive the failures of the
// peer proxies' methods; without one they panic.
func start(ctx context.Context, cfg Config, tb testing.TB) (*Cluster, error) {
	n := cfg.Members
	if n == 0 {
		n = 1
	}
	if n != 1 && n != 3 {
		return nil, fmt.Errorf("etcdtest: %d members: want 1 or 3", n)
	}
	c := &Cluster{}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "leasefence-etcd-")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: %w", err)
		}
		dir, c.tmpDir = d, d
	}
	// Ports are picked by binding to port 0 and letting go; another process
	// may take one in between, so a failed start is retried with new ports.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if err := c.startMembers(ctx, cfg, tb, n, dir, attempt); err != nil {
			lastErr = err
			c.stopMembers()
			if ctx.Err() != nil {
				break
			}
			continue
		}
		return c, nil
	}
	c.Close()
	return nil, fmt.Errorf("etcdtest: start: %w", lastErr)
}

func (c *Cluster) startMembers(ctx context.Context, cfg Config, tb testing.TB, n int, dir string, attempt int) error {
	c.Members = nil
	ports, err := etcdproc.FreePorts(3 * n)
	if err != nil {
		return err
	}
	var initial []string
	for i := 0; i < n; i++ {
		scheme := "http"
		if cfg.ClientTLS != nil {
			scheme = "https"
		}
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		}
		c.Members = append(c.Members, m)
		advertised := m.PeerURL
		if cfg.PeerProxies {
			p, u, err := etcdproc.NewProxy(tb, fmt.Sprintf("127.0.0.1:%d", ports[2*n+i]), m.PeerURL)
			if err != nil {
				return err
			}
			m.peerProxy, advertised = p, u
		}
		initial = append(initial, m.Name+"="+advertised)
	}
	for _, m := range c.Members {
		m.cfg = memberConfig(cfg, m, initial, dir, attempt)
	}
	// Members of a new cluster wait for each other, so start them together.
	errc := make(chan error, n)
	for _, m := range c.Members {
		go func() { errc <- m.start(ctx) }()
	}
	var errs []error
	for range c.Members {
		errs = append(errs, <-errc)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.endpoints = nil
	for _, m := range c.Members {
		c.endpoints = append(c.endpoints, m.ClientURL)
	}
	return nil
}

// memberConfig is member m's embedded etcd configuration.
func memberConfig(cfg Config, m *Member, initial []string, dir string, attempt int) *embed.Config {
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	ec := embed.NewConfig()
	ec.Name = m.Name
	ec.Dir = fmt.Sprintf("%s/%s.%d", dir, m.Name, attempt)
	cu, _ := url.Parse(m.ClientURL)
	pu, _ := url.Parse(m.PeerURL)
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	if m.peerProxy != nil {
		au, _ := url.Parse(strings.Replace(initialURL(initial, m.Name), "tcp://", "http://", 1))
		ec.AdvertisePeerUrls = []url.URL{*au}
	}
	ec.InitialCluster = strings.Join(initial, ",")
	ec.InitialClusterToken = "leasefence-test"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.Named(m.Name))
	if cfg.ClientTLS != nil {
		ec.ClientTLSInfo = *cfg.ClientTLS
	}
	// bcrypt's lowest cost: the default makes each password check cost a
	// test cluster tens of milliseconds of CPU (much more under -race on
	// a loaded machine, where a client's authentication outran its dial
	// timeout), and these clusters guard nothing.
	ec.BcryptCost = 4
	ec.UnsafeNoFsync = cfg.NoFsync
	if cfg.TickMs > 0 {
		ec.TickMs = cfg.TickMs
	}
	if cfg.ElectionMs > 0 {
		ec.ElectionMs = cfg.ElectionMs
	}
	return ec
}

func (m *Member) start(ctx context.Context) error {
	e, err := embed.StartEtcd(m.cfg)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("member %s: %w", m.Name, err)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("member %s: %w", m.Name, ctx.Err())
	}
	m.mu.Lock()
	m.etc = e
	m.mu.Unlock()
	return nil
}

// Stop stops the member, keeping its data so that Restart can bring it back.
// Stopping a stopped member does nothing.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.etc
	m.etc = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped member again on the same ports and data.
func (m *Member) Restart(ctx context.Context) error {
	m.mu.Lock()
	running := m.etc != nil
	m.mu.Unlock()
	if running {
		return nil
	}
	m.cfg.ClusterState = embed.ClusterStateFlagExisting
	return m.start(ctx)
}

// Server returns the running embedded server, or nil while stopped.
func (m *Member) Server() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etc
}

// Endpoints lists the client URLs of every member.
func (c *Cluster) Endpoints() []string { return append([]string(nil), c.endpoints...) }

func (c *Cluster) stopMembers() {
	for _, m := range c.Members {
		m.Stop()
		if m.peerProxy != nil {
			m.peerProxy.Close()
		}
	}
}

// initialURL finds a member's URL in an initial-cluster list.
func initialURL(initial []string, name string) string {
	for _, e := range initial {
		if u, ok := strings.CutPrefix(e, name+"="); ok {
			return u
		}
	}
	return ""
}

// Close stops every member and removes temporary data. It is safe to call
// more than once.
func (c *Cluster) Close() {
	c.stopMembers()
	if c.tmpDir != "" {
		os.RemoveAll(c.tmpDir)
		c.tmpDir = ""
	}
}

// Leader returns the running member that is the raft leader, or nil if no
// running member says it leads.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members {
		if e := m.Server(); e != nil && e.Server.Leader() == e.Server.MemberID() {
			return m
		}
	}
	return nil
}
