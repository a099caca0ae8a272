package fenceotel_test

import (
	"context"
	"os"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }

// kit is a Telemetry over the SDK's span recorder and a manual metric
// reader, as a test reads them.
type kit struct {
	tel    *fenceotel.Telemetry
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

func newKit(t *testing.T, opts ...fenceotel.Option) *kit {
	t.Helper()
	k := &kit{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	k.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.reader))
	t.Cleanup(func() {
		k.tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	tel, err := fenceotel.New(append([]fenceotel.Option{fenceotel.WithTracerProvider(k.tp), fenceotel.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	k.tel = tel
	return k
}

// ended returns the ended spans named name, oldest first.
func (k *kit) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range k.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// metric reads one series: a counter's or up-down counter's value, or a
// histogram's count, over the data points whose attributes include attrs.
func (k *kit) metric(t *testing.T, name string, attrs ...attribute.KeyValue) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes, attrs) {
						sum += float64(p.Value)
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes, attrs) {
						sum += float64(p.Count)
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return sum
}

func has(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if v, ok := set.Value(a.Key); !ok || v != a.Value {
			return false
		}
	}
	return true
}

// attr returns a span's attribute.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttr fails unless span s has attribute a.
func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, a attribute.KeyValue) {
	t.Helper()
	v, ok := attr(s, a.Key)
	if !ok || v != a.Value {
		t.Errorf("%s: %s = %v (set: %v), want %v", s.Name(), a.Key, v.String(), ok, a.Value.String())
	}
}

// event returns a span's event named name.
func event(s sdktrace.ReadOnlySpan, name string) (sdktrace.Event, bool) {
	for _, e := range s.Events() {
		if e.Name == name {
			return e, true
		}
	}
	return sdktrace.Event{}, false
}

// want fails unless the series has the value want (see metric).
func (k *kit) want(t *testing.T, name string, want float64, attrs ...attribute.KeyValue) {
	t.Helper()
	if v := k.metric(t, name, attrs...); v != want {
		t.Errorf("%s %v = %v, want %v", name, attrs, v, want)
	}
}

// wantLinked fails unless span s has one link, to span to.
func wantLinked(t *testing.T, s, to sdktrace.ReadOnlySpan) {
	t.Helper()
	if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != to.SpanContext().SpanID() {
		t.Errorf("%s links %v, want %s's span", s.Name(), links, to.Name())
	}
}
