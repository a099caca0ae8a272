package fenceotel

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/leasefence/leasefence/fence/fenceotel"

// Telemetry turns the hooks of package lease and package fence into spans
// and metrics. It is safe for concurrent use; one Telemetry may serve any
// number of sessions and fences.
type Telemetry struct {
	tracer trace.Tracer
	inst   instruments
	label  func(string) string
}

// Option configures New.
type Option func(*config) error

type config struct {
	tp    trace.TracerProvider
	mp    metric.MeterProvider
	label func(string) string
}

// WithTracerProvider sets where spans go; the default is the global
// TracerProvider (otel.GetTracerProvider) as it is when New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return errors.New("nil TracerProvider")
		}
		c.tp = tp
		return nil
	}
}

// WithMeterProvider sets where metrics go; the default is the global
// MeterProvider (otel.GetMeterProvider) as it is when New is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("nil MeterProvider")
		}
		c.mp = mp
		return nil
	}
}

// WithNameAttribute maps each lock name to the value of the metrics'
// leasefence.lock.name attribute, to keep the number of series bounded when
// names are not (say "shards/123456" to "shards"); an empty result leaves
// the attribute out. The default keeps names as they are. Spans always
// carry the whole name. f must be safe for concurrent use.
func WithNameAttribute(f func(name string) string) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("nil name attribute func")
		}
		c.label = f
		return nil
	}
}

// New builds a Telemetry. A bad option gives an error wrapping
// fence.ErrInvalidArgument.
func New(opts ...Option) (*Telemetry, error) {
	c := config{label: func(n string) string { return n }}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("fenceotel: %w: nil Option", fence.ErrInvalidArgument)
		}
		if err := opt(&c); err != nil {
			return nil, fmt.Errorf("fenceotel: %w: %w", fence.ErrInvalidArgument, err)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	inst, err := newInstruments(c.mp.Meter(ScopeName))
	if err != nil {
		return nil, fmt.Errorf("fenceotel: instruments: %w", err)
	}
	return &Telemetry{tracer: c.tp.Tracer(ScopeName), inst: inst, label: c.label}, nil
}

// LeaseHooks returns hooks for lease.WithHooks: spans of the calls, and
// the metrics of sessions and locks.
func (t *Telemetry) LeaseHooks() *lease.Hooks {
	h := t.leaseMetrics()
	h.Call = t.call
	return h
}

// FenceHooks returns hooks for fence.Txn.WithHooks, sqlfence.WithHooks,
// objectfence.WithHooks, fencehttp.WithHooks and fencegrpc.WithHooks:
// spans of the writes, marks on the server spans of fenced requests, and
// the refusal metrics.
func (t *Telemetry) FenceHooks() *fence.Hooks {
	return &fence.Hooks{
		Refused:        t.refused,
		OutcomeUnknown: t.outcomeUnknown,
		Write:          t.write,
	}
}
