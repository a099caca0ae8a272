package leasetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// member is the etcd server behind a Server: etcd's own server package,
// run in the test's process on two loopback ports.
type member struct {
	cfg      *embed.Config
	endpoint string

	mu  sync.Mutex
	etc *embed.Etcd // nil while stopped
}

// startMember starts a member with its data under dir and waits until it
// serves, or ctx ends. Its ports are found free by binding and letting go;
// another process may take one in between, so a failed start is tried
// again, twice, on new ports.
func startMember(ctx context.Context, c config, dir string) (*member, error) {
	for attempt := 0; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		m := &member{
			cfg:      memberConfig(c, filepath.Join(dir, fmt.Sprint(attempt)), ports),
			endpoint: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		}
		err = m.start(ctx)
		if err == nil {
			return m, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// memberConfig is the embedded server's configuration: one member, quiet
// unless the test gave a logger, on 127.0.0.1.
func memberConfig(c config, dir string, ports []int) *embed.Config {
	lg := c.logger
	if lg == nil {
		lg = zap.NewNop()
	}
	ec := embed.NewConfig()
	ec.Name = "leasetest"
	ec.Dir = dir
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	ec.InitialClusterToken = "leasetest"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	if c.electionMs > 0 {
		ec.ElectionMs, ec.TickMs = c.electionMs, c.tickMs
	}
	return ec
}

// start starts the server and waits until it serves.
func (m *member) start(ctx context.Context) error {
	e, err := embed.StartEtcd(m.cfg)
	if err != nil {
		return fmt.Errorf("leasetest: start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("leasetest: start etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("leasetest: start etcd: %w", ctx.Err())
	}
	m.mu.Lock()
	m.etc = e
	m.mu.Unlock()
	return nil
}

// stop stops the server, keeping its data. Stopping a stopped member
// does nothing.
func (m *member) stop() {
	m.mu.Lock()
	e := m.etc
	m.etc = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// restart starts a stopped member again on its ports and data; a running
// one is left as it is.
func (m *member) restart(ctx context.Context) error {
	m.mu.Lock()
	running := m.etc != nil
	m.mu.Unlock()
	if running {
		return nil
	}
	m.cfg.ClusterState = embed.ClusterStateFlagExisting
	return m.start(ctx)
}

// freePorts finds n loopback ports free now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("leasetest: free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// newClient opens a quiet client of endpoints, with a short dial timeout
// so that an unreachable server is an error, never a hang. With dial, its
// connections are opened by dial and pinged (gRPC keep-alive) no more
// often than etcd allows by default (5 s): a connection whose packets were
// dropped for a while is replaced once a ping fails, not left in TCP's
// retransmission backoff.
func newClient(endpoints []string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if dial != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(dial)}
		cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout = 5*time.Second, 2*time.Second
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("leasetest: client: %w", err)
	}
	return cli, nil
}

// startProxy starts etcd's fault proxy on a free loopback port in front of
// target (a client URL) and waits until it is ready. A port found free
// may be taken before the proxy binds it: up to five ports are tried.
func startProxy(target string) (proxy.Server, string, error) {
	to, err := url.Parse(target)
	if err != nil {
		return nil, "", fmt.Errorf("leasetest: proxy target %q: %w", target, err)
	}
	for attempt := 0; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return nil, "", err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p := proxy.NewServer(proxy.ServerConfig{
			Logger: zap.NewNop(),
			From:   url.URL{Scheme: "tcp", Host: addr},
			To:     url.URL{Scheme: "tcp", Host: to.Host},
		})
		select {
		case <-p.Ready():
			return p, "http://" + addr, nil
		case err = <-p.Error():
			p.Close()
		case <-time.After(10 * time.Second):
			p.Close()
			err = fmt.Errorf("not ready after 10s")
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
			return nil, "", fmt.Errorf("leasetest: proxy on %s: %w", addr, err)
		}
	}
}
