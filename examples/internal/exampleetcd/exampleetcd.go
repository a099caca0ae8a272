// Package exampleetcd gives the runnable examples an etcd client: to the
// endpoints given with -endpoints or ETCD_ENDPOINTS, or else to an embedded
// etcd started for the run, and says which.
package exampleetcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
)

// Connect returns a client and a function that closes it (and stops the
// embedded etcd, if one was started). endpoints is a comma-separated list;
// empty means ETCD_ENDPOINTS, and if that is empty too, an embedded etcd.
func Connect(ctx context.Context, endpoints string, out io.Writer) (*clientv3.Client, func(), error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		eps, _ = etcdproc.External()
	}
	stop := func() {}
	if len(eps) == 0 {
		start := time.Now()
		c, err := etcdtest.Start(ctx, etcdtest.Config{})
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(out, "no -endpoints or %s given: started an embedded etcd at %s in %v\n",
			etcdproc.EnvEndpoints, c.Endpoints()[0], time.Since(start).Round(time.Millisecond))
		eps, stop = c.Endpoints(), c.Close
	} else {
		fmt.Fprintf(out, "using etcd at %s\n", strings.Join(eps, ","))
	}
	cli, err := etcdproc.NewClient(eps)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return cli, func() { cli.Close(); stop() }, nil
}

// ProxiedClient puts etcd's fault proxy in front of target and returns a
// client that reaches etcd only through it, so that the example can cut
// that client's network. close closes both.
func ProxiedClient(target string) (p proxy.Server, cli *clientv3.Client, close func(), err error) {
	p, url, err := NewProxy(target)
	if err != nil {
		return nil, nil, nil, err
	}
	cli, err = etcdproc.NewClient([]string{url})
	if err != nil {
		p.Close()
		return nil, nil, nil, err
	}
	return p, cli, func() { cli.Close(); p.Close() }, nil
}

// NewProxy starts etcd's fault-injecting TCP proxy, in this process, on a
// free loopback port in front of target (a URL or host:port: an etcd
// member, or the example's own server) and returns it ready, with its
// URL. The caller closes it. (The tests' proxy is etcdproc.Proxy, a
// process of its own: an example is a program, which should not build one
// when it runs.)
func NewProxy(target string) (proxy.Server, string, error) {
	if !strings.Contains(target, "://") {
		target = "http://" + target
	}
	to, err := url.Parse(target)
	if err != nil {
		return nil, "", fmt.Errorf("proxy target %q: %w", target, err)
	}
	// A port found free can be taken by another process before the proxy
	// binds it: try another one.
	for attempt := 0; ; attempt++ {
		ports, err := etcdproc.FreePorts(1)
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
		case <-time.After(10 * time.Second):
			err = fmt.Errorf("proxy on %s not ready after 10s", addr)
		}
		p.Close()
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
			return nil, "", fmt.Errorf("proxy: %w", err)
		}
	}
}
