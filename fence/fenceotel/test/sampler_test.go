package fenceotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// remote is a context whose parent is a remote span, sampled or not, as a
// propagator leaves an incoming request's.
func remote(sampled bool) context.Context {
	cfg := trace.SpanContextConfig{TraceID: trace.TraceID{7}, SpanID: trace.SpanID{7}, Remote: true}
	if sampled {
		cfg.TraceFlags = trace.FlagsSampled
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(cfg))
}

// No sampler and no mix of recorded and unrecorded contexts makes the
// hooks panic: a lock taken in one kind of context and released, lost,
// resigned or fenced in another (issue 47: a lock taken in a recorded
// trace and released under an unsampled remote parent panicked, comparing
// spans of uncomparable types; a ratio sampler did within 20 rounds).
func TestSamplerMatrixNeverPanics(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	samplers := map[string]sdktrace.Sampler{
		"always":             sdktrace.AlwaysSample(),
		"never":              sdktrace.NeverSample(),
		"ratio":              sdktrace.TraceIDRatioBased(0.5),
		"parent-based":       sdktrace.ParentBased(sdktrace.AlwaysSample()),
		"parent-based-ratio": sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.5)),
	}
	contexts := map[string]func() context.Context{
		"background":       context.Background,
		"sampled-remote":   func() context.Context { return remote(true) },
		"unsampled-remote": func() context.Context { return remote(false) },
	}
	for sname, sampler := range samplers {
		t.Run(sname, func(t *testing.T) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			t.Cleanup(func() {
				tp.Shutdown(context.Background())
				mp.Shutdown(context.Background())
			})
			tel, err := fenceotel.New(fenceotel.WithTracerProvider(tp), fenceotel.WithMeterProvider(mp))
			if err != nil {
				t.Fatal(err)
			}
			s, err := lease.NewSession(context.Background(), cli, lease.WithTTL(2*time.Second), lease.WithHooks(tel.LeaseHooks()))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			name := etcdproc.Name(t, "sampler-"+sname)
			for round := range 3 {
				for from, take := range contexts {
					for to, end := range contexts {
						what := fmt.Sprintf("round %d, taken under %s, ended under %s", round, from, to)
						matrixRound(t, cli, s, tel, name, take(), end(), what)
					}
				}
			}
		})
	}
}

// matrixRound takes name under take and ends it under end four ways:
// Unlock, a fenced commit then Unlock, Resign, and a loss.
func matrixRound(t *testing.T, cli *clientv3.Client, s *lease.Session, tel *fenceotel.Telemetry, name string, take, end context.Context, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(take, 30*time.Second)
	defer cancel()
	l, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatalf("%s: Lock: %v", what, err)
	}
	wctx, stop := context.WithTimeout(end, 30*time.Second)
	defer stop()
	txn := fence.NewTxn(wctx, cli, fence.Held(l)).WithHooks(tel.FenceHooks()).Then(clientv3.OpPut(name+"-data", what))
	if _, err := txn.Commit(); err != nil {
		t.Fatalf("%s: fenced commit: %v", what, err)
	}
	if err := l.Unlock(end); err != nil {
		t.Fatalf("%s: Unlock: %v", what, err)
	}
	e, err := s.Campaign(ctx, name, "v")
	if err != nil {
		t.Fatalf("%s: Campaign: %v", what, err)
	}
	if err := e.Resign(end); err != nil {
		t.Fatalf("%s: Resign: %v", what, err)
	}
	l, err = s.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("%s: TryLock: %v", what, err)
	}
	if _, err := cli.Delete(ctx, l.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the loss was not seen", what)
	}
	if err := l.Unlock(end); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("%s: Unlock after the loss: %v, want ErrLost", what, err)
	}
}
