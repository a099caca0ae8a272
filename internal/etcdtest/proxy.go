package etcdtest

import (
	"errors"
	"fmt"
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

// Proxy puts etcd's fault-injecting TCP proxy on a free loopback port in
// front of target (a client URL) and returns it with its own URL. It is
// closed when the test ends.
func Proxy(tb testing.TB, target string) (proxy.Server, string) {
	tb.Helper()
	p, url, err := NewProxy("", target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p, url
}

// ProxyAt is Proxy on a given loopback address, for bringing a closed proxy
// back on the address its clients know.
func ProxyAt(tb testing.TB, addr, target string) proxy.Server {
	tb.Helper()
	p, _, err := NewProxy(addr, target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// NewProxy starts etcd's fault-injecting proxy on addr (a free loopback
// port if empty) in front of target, a client URL, and returns it ready,
// with its URL. The caller closes it.
func NewProxy(addr, target string) (proxy.Server, string, error) {
	if !strings.Contains(target, "://") { // ETCD_ENDPOINTS may give host:port
		target = "http://" + target
	}
	to, err := url.Parse(target)
	if err != nil {
		return nil, "", fmt.Errorf("proxy target %q: %w", target, err)
	}
	if addr != "" {
		return startProxy(addr, to.Host)
	}
	// A port found free can be taken by another test before the proxy
	// binds it (runs go in parallel): try another one.
	for attempt := 0; ; attempt++ {
		ports, err := etcdproc.FreePorts(1)
		if err != nil {
			return nil, "", err
		}
		p, u, err := startProxy(fmt.Sprintf("127.0.0.1:%d", ports[0]), to.Host)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
			return p, u, err
		}
	}
}

// startProxy starts the proxy on addr in front of host and waits until it
// is ready.
func startProxy(addr, host string) (proxy.Server, string, error) {
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(),
		From:   url.URL{Scheme: "tcp", Host: addr},
		To:     url.URL{Scheme: "tcp", Host: host},
	})
	select {
	case <-p.Ready():
		return p, "http://" + addr, nil
	case err := <-p.Error():
		p.Close()
		return nil, "", fmt.Errorf("proxy: %w", err)
	case <-time.After(10 * time.Second):
		p.Close()
		return nil, "", fmt.Errorf("proxy on %s not ready after 10s", addr)
	}
}

// ProxiedClient puts a proxy in front of target and opens a client that
// reaches etcd only through it. Both are closed when the test ends.
func ProxiedClient(tb testing.TB, target string) (proxy.Server, *clientv3.Client, string) {
	tb.Helper()
	p, url := Proxy(tb, target)
	return p, etcdproc.Client(tb, []string{url}), url
}
