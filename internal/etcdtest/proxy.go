package etcdtest

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy puts etcd's fault-injecting TCP proxy on a free loopback port in
// front of target (a client URL) and returns it with its own URL. It is
// closed when the test ends.
func Proxy(tb testing.TB, target string) (proxy.Server, string) {
	tb.Helper()
	ports, err := freePorts(1)
	if err != nil {
		tb.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	return ProxyAt(tb, addr, target), "http://" + addr
}

// ProxyAt is Proxy on a given loopback address, for bringing a closed proxy
// back on the address its clients know.
func ProxyAt(tb testing.TB, addr, target string) proxy.Server {
	tb.Helper()
	to, err := url.Parse(target)
	if err != nil {
		tb.Fatalf("proxy target %q: %v", target, err)
	}
	from := url.URL{Scheme: "tcp", Host: addr}
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(),
		From:   from,
		To:     url.URL{Scheme: "tcp", Host: to.Host},
	})
	select {
	case <-p.Ready():
	case err := <-p.Error():
		tb.Fatalf("proxy: %v", err)
	case <-time.After(10 * time.Second):
		tb.Fatal("proxy not ready after 10s")
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// ProxiedClient puts a proxy in front of target and opens a client that
// reaches etcd only through it. Both are closed when the test ends.
func ProxiedClient(tb testing.TB, target string) (proxy.Server, *clientv3.Client, string) {
	tb.Helper()
	p, url := Proxy(tb, target)
	return p, client(tb, []string{url}), url
}
