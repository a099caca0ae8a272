package lease

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// grant asks etcd for a lease. A connection whose TLS handshake fails for a
// certificate reason (an untrusted server, a missing or refused client
// certificate) would only show as ctx's deadline: etcd's client waits for a
// ready connection and retries the handshake. While the grant waits, grant
// follows the connection's state, asks a failed connection for its reason,
// and fails at once with ErrTLSHandshake if it is a certificate's.
//
// A grant that etcd leaves unanswered is logged at warn level, with the
// endpoints, and reported to Hooks.Unanswered, first after
// unansweredFirst and then every unansweredEvery while it keeps waiting:
// an unreachable etcd would otherwise look like a silent hang.
func grant(ctx context.Context, client *clientv3.Client, ttl int64, o options) (*clientv3.LeaseGrantResponse, error) {
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := handshakeFailure(gctx, client); err != nil {
			cancel(err)
		}
	}()
	go func() {
		defer wg.Done()
		warnUnanswered(gctx, client, o)
	}()
	resp, err := client.Grant(gctx, ttl)
	cancel(nil) // ends the watcher; a cause it set first stays
	wg.Wait()
	if cause := context.Cause(gctx); err != nil && ctx.Err() == nil && cause != context.Canceled {
		return nil, cause
	}
	return resp, err
}

// handshakeFailure follows the client's connection while ctx lives and
// returns the reason it failed if that reason is a certificate's. A ready
// connection costs nothing more; only a failed one is probed.
//
// A server that refuses the client's certificate sends a TLS alert and
// hangs up, and the client may see only the hang-up (a broken pipe, a
// reset) when it writes before it reads the alert. gRPC then keeps
// reporting the failure, without a new state, until a connection is ready
// (its failure state is sticky), so a failed connection is not waited on
// for a new state: it is probed again and again, 20 ms apart at first and
// at most 100 ms apart (a probe of a failed connection sends nothing), and
// after a hang-up it is also made to try again at once, as the next
// attempt usually reads the alert. (Waiting for a new state after a few
// probes left one run in twenty of TestTLSAndAuth stuck until its
// deadline.)
func handshakeFailure(ctx context.Context, client *clientv3.Client) error {
	conn := client.ActiveConnection()
	retry := newBackoff(20*time.Millisecond, 100*time.Millisecond)
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			hungUp, err := probe(ctx, conn)
			if err != nil {
				return err
			}
			if hungUp {
				conn.ResetConnectBackoff()
			}
			if retry.wait(ctx) != nil {
				return nil
			}
			continue
		}
		if !conn.WaitForStateChange(ctx, state) {
			return nil
		}
	}
}

// probe opens a stream that does not wait for a ready connection: on a
// failed one, gRPC answers at once with the connection's last error. (A
// stream, not a unary call: etcd's client retries unary calls on that
// error and keeps only the deadline.) err is a certificate's failure;
// hungUp tells that the server hung up without a reason the client read.
// Nothing is sent on the stream, which is cancelled unused.
func probe(ctx context.Context, conn *grpc.ClientConn) (hungUp bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = pb.NewLeaseClient(conn).LeaseKeepAlive(sctx, grpc.WaitForReady(false))
	if err == nil {
		return false, nil
	}
	msg := status.Convert(err).Message()
	for _, sign := range []string{"authentication handshake failed", "x509:", "tls:", "certificate"} {
		if strings.Contains(msg, sign) {
			return false, fmt.Errorf("%w: %s", ErrTLSHandshake, msg)
		}
	}
	for _, sign := range []string{"broken pipe", "connection reset", "closed before server preface"} {
		if strings.Contains(msg, sign) {
			return true, nil
		}
	}
	return false, nil
}

// How long a lease grant may go unanswered before it is reported, and how
// often after that.
const (
	unansweredFirst = 2 * time.Second
	unansweredEvery = 10 * time.Second
)

// warnUnanswered reports a grant still waiting for etcd, until ctx ends.
func warnUnanswered(ctx context.Context, client *clientv3.Client, o options) {
	start := time.Now()
	t := time.NewTimer(unansweredFirst)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		waited := time.Since(start)
		o.logger.Warn("etcd has not answered a lease grant; still trying",
			zap.Strings("endpoints", client.Endpoints()), zap.Duration("waited", waited))
		if o.hooks.Unanswered != nil {
			o.hooks.Unanswered(waited)
		}
		t.Reset(unansweredEvery)
	}
}
