package fencegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// counter stands for a service's state: grpc-go's interop test service,
// whose UnaryCall adds to it under the Store's atomic step.
type counter struct {
	testpb.UnimplementedTestServiceServer
	store *fencestore.MemoryStore
	n     int
}

func (c *counter) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	claim, _ := fencegrpc.ClaimFrom(ctx)
	err := c.store.Do(ctx, claim, func() error { c.n++; return nil })
	if err != nil {
		return nil, fencegrpc.Error(claim, err)
	}
	return &testpb.SimpleResponse{}, nil
}

// A fenced service: the Checker's interceptors on the server, the client
// interceptors on the connection, and each call made under a lock holding
// (a *lease.Lock in a real client). The late call of an earlier holding is
// refused with Aborted, and the client reads it as a *fence.StaleError.
func Example() {
	store := fencestore.NewMemoryStore()
	ck, err := fencegrpc.NewChecker(store, fencegrpc.WithLockName("counter"), fencegrpc.WithCheckInHandler())
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(ck.StreamServerInterceptor()))
	testpb.RegisterTestServiceServer(srv, &counter{store: store})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(fencegrpc.StreamClientInterceptor()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testpb.NewTestServiceClient(conn)

	ctx := context.Background()
	for _, h := range []fence.Holder{holder{"counter", 5}, holder{"counter", 6}, holder{"counter", 5}} {
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, fencegrpc.WithHolder(h))
		var se *fence.StaleError
		switch {
		case err == nil:
			fmt.Printf("token %d: written\n", h.Token())
		case errors.As(err, &se):
			fmt.Printf("token %d: %v, refused by %d\n", h.Token(), status.Code(err), se.Highest)
		default:
			fmt.Printf("token %d: %v\n", h.Token(), err)
		}
	}
	// Output:
	// token 5: written
	// token 6: written
	// token 5: Aborted, refused by 6
}
