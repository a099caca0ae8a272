package fencegrpc_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// putter is a test service whose UnaryCall writes an etcd key: plainly,
// or through a fence.Txn guarded by the call's claim.
type putter struct {
	testpb.UnimplementedTestServiceServer
	put func(ctx context.Context) error
}

func (p putter) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if err := p.put(ctx); err != nil {
		c, _ := fencegrpc.ClaimFrom(ctx)
		return nil, fencegrpc.Error(c, err)
	}
	return &testpb.SimpleResponse{}, nil
}

// BenchmarkUnary is one unary call that writes an etcd key, as
// fencehttp's BenchmarkPUT is for HTTP: plain, with no interceptor;
// behind the interceptors with the memory store; with the etcd store,
// which checks, and the handler's write in a transaction that checks
// again; and with the check left to that transaction alone
// (WithCheckInHandler). All in the same run.
func BenchmarkUnary(b *testing.B) {
	cli := etcd.Client(b)
	key := etcdproc.Name(b, "bench-object")
	// A fixed token: what verifying costs is bench/verify_test.go's.
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(b, "bench-records")+"/", fencestore.WithoutVerifier())
	if err != nil {
		b.Fatal(err)
	}
	plain := putter{put: func(ctx context.Context) error { _, err := cli.Put(ctx, key, "v"); return err }}
	fenced := putter{put: func(ctx context.Context) error {
		c, _ := fencegrpc.ClaimFrom(ctx)
		_, err := fence.NewTxn(ctx, cli, store.Guard(c)).Then(clientv3.OpPut(key, "v")).Commit()
		return err
	}}
	cases := []struct {
		impl  string
		srv   putter
		store fencestore.Store
		opts  []fencegrpc.Option
	}{
		{"plain", plain, nil, nil},
		{"memorystore", plain, fencestore.NewMemoryStore(), nil},
		{"etcdstore", fenced, store, nil},
		{"etcdstore-in-handler", fenced, store, []fencegrpc.Option{fencegrpc.WithCheckInHandler()}},
	}
	for _, c := range cases {
		b.Run("impl="+c.impl, func(b *testing.B) {
			client := benchClient(b, c.srv, c.store, c.opts)
			ctx := context.Background()
			h := fencegrpc.WithHolder(holder{"bench", 7})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchClient serves p on loopback, behind a Checker over store unless
// store is nil, and returns a client with the client interceptors.
func benchClient(b *testing.B, p putter, store fencestore.Store, opts []fencegrpc.Option) testpb.TestServiceClient {
	var sopts []grpc.ServerOption
	if store != nil {
		ck, err := fencegrpc.NewChecker(store, append(opts, fencegrpc.WithLockName("bench"))...)
		if err != nil {
			b.Fatal(err)
		}
		sopts = append(sopts, grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()))
	}
	srv := grpc.NewServer(sopts...)
	testpb.RegisterTestServiceServer(srv, p)
	conn := connect(b, srv, grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor()))
	return testpb.NewTestServiceClient(conn)
}
