package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Kept only for lease/leasetest and examples/lockctl, which are being made
// self-contained: delete each with its last user. Everything else calls
// package etcdproc's (etcdproc.ProxyT for a proxy).

// Name is etcdproc.Name.
func Name(tb testing.TB, base string) string { return etcdproc.Name(tb, base) }

// NewClientVia is etcdproc.NewClientVia.
func NewClientVia(endpoints []string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*clientv3.Client, error) {
	return etcdproc.NewClientVia(endpoints, dial)
}

// Proxy puts etcd's fault-injecting TCP proxy, in process, on a free
// loopback port in front of target (a client URL) and returns it with its
// own URL. It is closed when the test ends.
func Proxy(tb testing.TB, target string) (proxy.Server, string) {
	tb.Helper()
	if !strings.Contains(target, "://") { // ETCD_ENDPOINTS may give host:port
		target = "http://" + target
	}
	to, err := url.Parse(target)
	if err != nil {
		tb.Fatalf("proxy target %q: %v", target, err)
	}
	// A port found free can be taken by another test before the proxy
	// binds it (runs go in parallel): try another one.
	for attempt := 0; ; attempt++ {
		ports, err := etcdproc.FreePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p, err := startProxy(addr, to.Host)
		if err == nil {
			tb.Cleanup(func() { p.Close() })
			return p, "http://" + addr
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
			tb.Fatal(err)
		}
	}
}

// startProxy starts the proxy on addr in front of host and waits until it
// is ready.
func startProxy(addr, host string) (proxy.Server, error) {
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(),
		From:   url.URL{Scheme: "tcp", Host: addr},
		To:     url.URL{Scheme: "tcp", Host: host},
	})
	select {
	case <-p.Ready():
		return p, nil
	case err := <-p.Error():
		p.Close()
		return nil, fmt.Errorf("proxy: %w", err)
	case <-time.After(10 * time.Second):
		p.Close()
		return nil, fmt.Errorf("proxy on %s not ready after 10s", addr)
	}
}
