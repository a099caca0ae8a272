package fenceotel_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/lease"
)

// A request that takes a lock, writes under it and lets it go, traced
// together with the etcd client's own requests: each call's requests are
// children of its span. A service would give its exporter's
// TracerProvider (or none, for the global one) instead of a recorder.
func Example() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tel, err := fenceotel.New(fenceotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	// The etcd client traced through otelgrpc.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   etcd.Endpoints(),
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp)))},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	s, err := lease.NewSession(ctx, cli, lease.WithHooks(tel.LeaseHooks()))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	ctx, req := tp.Tracer("example").Start(ctx, "request")
	l, err := s.Lock(ctx, "example/otel/report")
	if err != nil {
		log.Fatal(err)
	}
	_, err = fence.NewTxn(ctx, cli, fence.Held(l)).WithHooks(tel.FenceHooks()).
		Then(clientv3.OpPut("example/otel/report/data", "v1")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	req.End()

	// The request's trace: its spans and their children, in order.
	children := map[string][]string{}
	for _, sp := range rec.Ended() {
		children[sp.Parent().SpanID().String()] = append(children[sp.Parent().SpanID().String()], sp.Name())
	}
	for _, sp := range rec.Ended() {
		if sp.Parent().SpanID() == req.SpanContext().SpanID() {
			fmt.Printf("%s: %s\n", sp.Name(), strings.Join(children[sp.SpanContext().SpanID().String()], ", "))
		}
	}
	// Output:
	// lease.Lock: etcdserverpb.KV/Txn
	// fence.Txn.Commit: etcdserverpb.KV/Txn
	// lease.Unlock: etcdserverpb.KV/Txn
}

// A service's set-up on the global providers, which do nothing until the
// service installs an SDK.
func ExampleNew() {
	var cli *clientv3.Client // connected elsewhere
	if err := traced(context.Background(), cli); err != nil {
		log.Print(err)
	}
}

// traced takes a session whose locks are traced, and commits a traced
// write.
func traced(ctx context.Context, cli *clientv3.Client, guards ...fence.Guard) error {
	tel, err := fenceotel.New() // the global TracerProvider and MeterProvider
	if err != nil {
		return err
	}
	s, err := lease.NewSession(ctx, cli, lease.WithHooks(tel.LeaseHooks()))
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = fence.NewTxn(ctx, cli, guards...).WithHooks(tel.FenceHooks()).Commit()
	return err
}

// An etcd client whose requests are spans, children of the lock's.
func Example_etcdClient() {
	endpoints := []string{"127.0.0.1:2379"}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialOptions: []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler())},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
}
