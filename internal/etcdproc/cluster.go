package etcdproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// EnvEndpoints names the environment variable that points tests at an
// existing etcd cluster instead of one they start: a comma-separated list
// of client URLs.
const EnvEndpoints = "ETCD_ENDPOINTS"

// External reports the endpoints from ETCD_ENDPOINTS, if it is set.
func External() ([]string, bool) {
	var eps []string
	for _, e := range strings.Split(os.Getenv(EnvEndpoints), ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps, len(eps) > 0
}

// Config says what to start. The zero value is one member with etcd's
// default timing, fsync on.
type Config struct {
	// NoFsync turns off etcd's fsync of its log and database
	// (--unsafe-no-fsync). Never for data that matters.
	NoFsync bool
	// Args are more flags for etcd (--auth-token-ttl=1, say).
	Args []string
}

// Cluster is a running single-member etcd: a child process with its data
// in a temporary directory.
type Cluster struct {
	procs *ProcCluster
	dir   string
}

// Start starts a member and waits until it serves requests, or ctx ends.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leasefence-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcdproc: %w", err)
	}
	var extra []string
	if cfg.NoFsync {
		extra = append(extra, "--unsafe-no-fsync")
	}
	extra = append(extra, cfg.Args...)
	// A port found free can be taken by another process before etcd binds
	// it: try new ports.
	for attempt := 0; ; attempt++ {
		var ports []int
		ports, err = FreePorts(2)
		if err != nil {
			break
		}
		host := ProcHost{IP: "127.0.0.1", ClientPort: ports[0], PeerPort: ports[1]}
		var procs *ProcCluster
		procs, err = startOn(ctx, bin, fmt.Sprintf("%s/%d", dir, attempt), []ProcHost{host}, extra, NewClient)
		if err == nil {
			return &Cluster{procs: procs, dir: dir}, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// Endpoints lists the client URLs.
func (c *Cluster) Endpoints() []string { return c.procs.Endpoints() }

// Close kills the member and removes its data. It is safe to call more
// than once.
func (c *Cluster) Close() {
	c.procs.Close()
	if c.dir != "" {
		os.RemoveAll(c.dir)
		c.dir = ""
	}
}

// NewClient opens a quiet client to endpoints, with a short dial timeout so
// that an unreachable cluster is an error, never a hang.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	return NewClientVia(endpoints, nil)
}

// NewClientVia is NewClient with connections opened by dial (nil: the
// default dialer): a lab host's DialContext reaches members inside
// network namespaces. Such clients also ping their connections (gRPC
// keep-alive), as a client on a real network should: a
// connection whose packets were dropped for a while can sit in TCP's
// retransmission backoff for tens of seconds after the network heals,
// and only a failed ping replaces it.
func NewClientVia(endpoints []string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if dial != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(dial)}
		// Not more often than etcd allows (--grpc-keepalive-min-time, 5 s
		// by default): more frequent pings get the connection closed.
		cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout = 5*time.Second, 2*time.Second
	}
	return clientv3.New(cfg)
}

// FreePorts finds n loopback ports free now. Another process may take one
// before the caller binds it: callers retry with new ports.
func FreePorts(n int) ([]int, error) {
	ports, release, err := HoldPorts(n)
	if err != nil {
		return nil, err
	}
	release()
	return ports, nil
}

// HoldPorts finds n free loopback ports and keeps them bound until release
// is called, so that listeners the caller opens meanwhile on port 0 cannot
// be given one of them.
func HoldPorts(n int) (ports []int, release func(), err error) {
	var ls []net.Listener
	release = func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("etcdproc: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, release, nil
}
