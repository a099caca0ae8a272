package fenceotel_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// setup is one set-up compared: its sub-benchmark's name and its
// Telemetry (nil for no hooks).
type setup struct {
	name string
	tel  *fenceotel.Telemetry
}

// telemetries are the set-ups compared: no hooks at all, fenceotel on
// no-op providers (what a service that installed no SDK gets from the
// global ones), and fenceotel recording every span and metric.
func telemetries(b *testing.B) []setup {
	noop, err := fenceotel.New(fenceotel.WithTracerProvider(tracenoop.NewTracerProvider()),
		fenceotel.WithMeterProvider(metricnoop.NewMeterProvider()))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	sdk, err := fenceotel.New(fenceotel.WithTracerProvider(tp), fenceotel.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	return []setup{{"otel=none", nil}, {"otel=noop", noop}, {"otel=sdk", sdk}}
}

// The uncontended path, Lock, a fenced put and Unlock, against real etcd,
// with each set-up. Sub-benchmarks run in turn within each -count round,
// so that rounds interleave; compare with benchstat. A plain put is timed
// beside them as the unit of a round trip.
func BenchmarkUncontended(b *testing.B) {
	cli := etcd.Client(b)
	ctx := context.Background()
	name := etcdproc.Name(b, "bench")
	b.Run("put", func(b *testing.B) {
		for b.Loop() {
			if _, err := cli.Put(ctx, name+"-put", "x"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, tc := range telemetries(b) {
		b.Run(tc.name, func(b *testing.B) {
			var lh *lease.Hooks
			var fh *fence.Hooks
			if tc.tel != nil {
				lh, fh = tc.tel.LeaseHooks(), tc.tel.FenceHooks()
			}
			s, err := lease.NewSession(ctx, cli, lease.WithTTL(5*time.Second), lease.WithHooks(lh))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for b.Loop() {
				l, err := s.Lock(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := fence.NewTxn(ctx, cli, fence.Held(l)).WithHooks(fh).Then(clientv3.OpPut(name+"-data", "x")).Commit(); err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// What the hooks of one Lock, fenced put and Unlock cost on their own,
// with no etcd: the calls a traced lock makes into fenceotel.
func BenchmarkHooks(b *testing.B) {
	ctx := context.Background()
	for _, tc := range telemetries(b)[1:] {
		b.Run(tc.name, func(b *testing.B) {
			lh, fh := tc.tel.LeaseHooks(), tc.tel.FenceHooks()
			for b.Loop() {
				cctx, ch := lh.Call(ctx, lease.Call{Op: "Lock", Name: "bench", Mode: lease.Write})
				lh.Acquired("bench", 7, time.Millisecond)
				if ch != nil {
					ch.Queued(0)
					ch.Done(7, nil)
				}
				_, verdict := fh.Write(cctx, fence.Write{Fence: "etcd", Guards: []fence.WriteGuard{{Kind: "held", Key: "bench/1", Token: 7}}})
				if verdict != nil {
					verdict(nil)
				}
				if ch != nil {
					_, rch := ch.Release(cctx, "Unlock")
					ch.Ended(time.Millisecond, lease.ErrUnlocked)
					rch.Done(7, nil)
				}
				lh.Ended("bench", 7, time.Millisecond, lease.ErrUnlocked)
			}
		})
	}
}
