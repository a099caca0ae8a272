package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// envEndpoints names the environment variable that gives the endpoints
// when -endpoints does not, as for etcdctl.
const envEndpoints = "ETCD_ENDPOINTS"

// defaultEndpoints is where etcd is when neither -endpoints nor
// ETCD_ENDPOINTS says: etcd's own default client URL. No scheme, so that
// TLS flags apply to it. A variable only for the tests.
var defaultEndpoints = "127.0.0.1:2379"

// config is what the global flags say.
type config struct {
	endpoints, cacert, cert, key, user, password string
	json                                         bool
	timeout                                      time.Duration
}

// resolveEndpoints gives the etcd client URLs to use, and where they came from,
// for an operator who must fix them when nobody answers.
func (cfg config) resolveEndpoints() ([]string, string) {
	if eps := splitList(cfg.endpoints); len(eps) > 0 {
		return eps, "from -endpoints"
	}
	if eps := splitList(os.Getenv(envEndpoints)); len(eps) > 0 {
		return eps, "from " + envEndpoints
	}
	return splitList(defaultEndpoints), "default; set -endpoints or " + envEndpoints
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// connect opens a client as the flags say, with etcd's TLS and auth, and
// waits until an endpoint answers. etcd's client connects lazily: without
// the wait, a wrong endpoint would show up as a bare "context deadline
// exceeded" from the first request, or, for watch, which retries until
// etcd comes back, as no output at all.
func connect(ctx context.Context, cfg config) (*clientv3.Client, error) {
	eps, from := cfg.resolveEndpoints()
	where := fmt.Sprintf("etcd at %s (%s)", strings.Join(eps, ", "), from)
	cc, err := clientConfig(cfg, eps)
	if err != nil {
		return nil, err
	}
	// With a user, New authenticates: the first request, which may time out.
	cli, err := clientv3.New(cc)
	if err == nil {
		if err = awaitReady(ctx, cli.ActiveConnection(), cfg.timeout); err != nil {
			cli.Close()
		}
	}
	switch {
	case err == nil:
		return cli, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("connecting to %s: %w", where, context.Cause(ctx))
	case unanswered(err):
		return nil, fmt.Errorf("%s did not answer within %v: %w", where, cfg.timeout, err)
	}
	return nil, fmt.Errorf("%s: %w", where, err)
}

// clientConfig is the client's configuration: endpoints, TLS and user.
func clientConfig(cfg config, eps []string) (clientv3.Config, error) {
	cc := clientv3.Config{Endpoints: eps, DialTimeout: cfg.timeout, Logger: zap.NewNop()}
	if cfg.cacert != "" || cfg.cert != "" {
		info := transport.TLSInfo{TrustedCAFile: cfg.cacert, CertFile: cfg.cert, KeyFile: cfg.key}
		tc, err := info.ClientConfig()
		if err != nil {
			return cc, fmt.Errorf("tls: %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		cc.TLS = tc
	}
	if cfg.user != "" {
		name, pw, ok := strings.Cut(cfg.user, ":")
		if !ok {
			pw = cfg.password
		}
		cc.Username, cc.Password = name, pw
	}
	return cc, nil
}

// awaitReady waits until conn has a connection up to some endpoint, for
// at most timeout.
func awaitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
	return nil
}

// unanswered tells whether err says that no endpoint answered in time.
func unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	c := status.Code(err)
	return c == codes.DeadlineExceeded || c == codes.Unavailable
}
