package grant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// Grant asks etcd for a lease. etcd's client retries a failed TLS
// handshake until ctx ends, so Grant watches the connection and fails at
// once with an error wrapping tlsErr on a certificate failure. While the
// grant is unanswered, unanswered is called with the time waited (after 2
// s, then every 10 s) rather than leave a silent hang; the grant fails
// when ctx ends with an error that names the endpoints.
func Grant(ctx context.Context, client *clientv3.Client, ttl int64, tlsErr error, unanswered func(waited time.Duration)) (*clientv3.LeaseGrantResponse, error) {
	start := time.Now()
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := handshakeFailure(gctx, client, tlsErr); err != nil {
			cancel(err)
		}
	}()
	go func() {
		defer wg.Done()
		warnUnanswered(gctx, unanswered)
	}()
	resp, err := client.Grant(gctx, ttl)
	cancel(nil) // ends the watcher; a cause it set first stays
	wg.Wait()
	if cause := context.Cause(gctx); err != nil && ctx.Err() == nil && cause != context.Canceled {
		return nil, cause
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Without a logger or hooks nothing else said so: the error does.
		return nil, fmt.Errorf("etcd at %s did not answer within %v: %w",
			strings.Join(client.Endpoints(), ", "), time.Since(start).Round(10*time.Millisecond), err)
	}
	return resp, err
}

// handshakeFailure returns the connection's failure, while ctx lives, if
// it is a certificate's. gRPC's failure state is sticky, so a failed
// connection is probed every 20 to 100 ms rather than waited on. After a
// hang-up it retries at once: a server that refuses the client's
// certificate may be seen only hanging up, and the next attempt usually
// reads its alert.
func handshakeFailure(ctx context.Context, client *clientv3.Client, tlsErr error) error {
	conn := client.ActiveConnection()
	retry := backoff.New(20*time.Millisecond, 100*time.Millisecond)
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			hungUp, err := probe(ctx, conn, tlsErr)
			if err != nil {
				return err
			}
			if hungUp {
				conn.ResetConnectBackoff()
			}
			if retry.Wait(ctx) != nil {
				return nil
			}
			continue
		}
		if !conn.WaitForStateChange(ctx, state) {
			return nil
		}
	}
}

// probe opens a stream that does not wait for a ready connection, to get
// a failed one's last error (etcd's client would retry a unary call). err
// wraps tlsErr for a certificate's failure; hungUp, a hang-up with no reason read.
func probe(ctx context.Context, conn *grpc.ClientConn, tlsErr error) (hungUp bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = pb.NewLeaseClient(conn).LeaseKeepAlive(sctx, grpc.WaitForReady(false))
	if err == nil {
		return false, nil
	}
	msg := status.Convert(err).Message()
	// Not "authentication handshake failed" alone: gRPC says so of any
	// handshake that did not finish, an endpoint's hang-up (EOF, reset)
	// or a timeout too, which retrying does fix.
	for _, sign := range []string{"x509:", "tls:", "certificate"} {
		if strings.Contains(msg, sign) {
			return false, fmt.Errorf("%w: %s", tlsErr, msg)
		}
	}
	for _, sign := range []string{"broken pipe", "connection reset", "closed before server preface"} {
		if strings.Contains(msg, sign) {
			return true, nil
		}
	}
	return false, nil
}

// When warnUnanswered first reports a grant, and how often after that.
const (
	unansweredFirst = 2 * time.Second
	unansweredEvery = 10 * time.Second
)

// warnUnanswered calls unanswered with the time waited, until ctx ends.
func warnUnanswered(ctx context.Context, unanswered func(time.Duration)) {
	start := time.Now()
	t := time.NewTimer(unansweredFirst)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		unanswered(time.Since(start))
		t.Reset(unansweredEvery)
	}
}
