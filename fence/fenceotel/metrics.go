package fenceotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/leasefence/leasefence/lease"
)

// Metric names, after OpenTelemetry's conventions: dotted, no unit or
// "_total" in the name, durations in seconds.
const (
	MetricHeld          = "leasefence.lock.held"
	MetricWaiting       = "leasefence.lock.waiting"
	MetricAcquire       = "leasefence.lock.acquire.duration"
	MetricHold          = "leasefence.lock.hold.duration"
	MetricLosses        = "leasefence.lock.losses"
	MetricMargin        = "leasefence.session.keepalive.margin"
	MetricSessionLosses = "leasefence.session.losses"
	MetricUnanswered    = "leasefence.session.grant.unanswered"
	MetricRefusals      = "leasefence.fence.refusals"
	MetricUnknown       = "leasefence.fence.unknown_outcomes"
)

type instruments struct {
	held, waiting              metric.Int64UpDownCounter
	acquire, hold, margin      metric.Float64Histogram
	losses, sessionLosses      metric.Int64Counter
	unanswered, refusals, unkn metric.Int64Counter
}

// buckets returns n boundaries from first, each factor times the last.
func buckets(first, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = first
		first *= factor
	}
	return b
}

// linear returns n boundaries step apart, the first at step.
func linear(step float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = step * float64(i+1)
	}
	return b
}

func newInstruments(m metric.Meter) (instruments, error) {
	var i instruments
	var errs [10]error
	i.held, errs[0] = m.Int64UpDownCounter(MetricHeld, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held by this process now."))
	i.waiting, errs[1] = m.Int64UpDownCounter(MetricWaiting, metric.WithUnit("{call}"),
		metric.WithDescription("Lock calls of this process waiting behind another holder now."))
	i.acquire, errs[2] = m.Float64Histogram(MetricAcquire, metric.WithUnit("s"),
		metric.WithDescription("Time to take a lock, waiting included."),
		metric.WithExplicitBucketBoundaries(buckets(0.001, 4, 10)...))
	i.hold, errs[3] = m.Float64Histogram(MetricHold, metric.WithUnit("s"),
		metric.WithDescription("How long locks were held."),
		metric.WithExplicitBucketBoundaries(buckets(0.01, 4, 12)...))
	i.losses, errs[4] = m.Int64Counter(MetricLosses, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost, by cause."))
	i.margin, errs[5] = m.Float64Histogram(MetricMargin, metric.WithUnit("s"),
		metric.WithDescription("At each keep-alive answer, the session's local deadline minus now: the early-warning budget."),
		metric.WithExplicitBucketBoundaries(linear(0.5, 20)...))
	i.sessionLosses, errs[6] = m.Int64Counter(MetricSessionLosses, metric.WithUnit("{session}"),
		metric.WithDescription("Sessions whose lease was lost."))
	i.unanswered, errs[7] = m.Int64Counter(MetricUnanswered, metric.WithUnit("{event}"),
		metric.WithDescription("Times a new session's lease grant had gone unanswered by etcd (after 2 s, then every 10 s)."))
	i.refusals, errs[8] = m.Int64Counter(MetricRefusals, metric.WithUnit("{write}"),
		metric.WithDescription("Writes refused by a fence, by guard."))
	i.unkn, errs[9] = m.Int64Counter(MetricUnknown, metric.WithUnit("{write}"),
		metric.WithDescription("Fenced writes whose outcome is unknown (no answer)."))
	return i, errors.Join(errs[:]...)
}

// nameSet is the attribute set of a lock name, mapped; empty if the map
// leaves it out.
func (t *Telemetry) nameSet(name string, more ...attribute.KeyValue) metric.MeasurementOption {
	if n := t.label(name); n != "" {
		more = append(more, AttrLockName.String(n))
	}
	return metric.WithAttributeSet(attribute.NewSet(more...))
}

// leaseMetrics are the hooks of the lease metrics. They have no context
// of a call: the measurements are made with a background one.
func (t *Telemetry) leaseMetrics() *lease.Hooks {
	bg := context.Background()
	return &lease.Hooks{
		Waiting: func(name string, delta int) { t.inst.waiting.Add(bg, int64(delta), t.nameSet(name)) },
		Acquired: func(name string, _ int64, waited time.Duration) {
			set := t.nameSet(name)
			t.inst.held.Add(bg, 1, set)
			t.inst.acquire.Record(bg, waited.Seconds(), set)
		},
		Ended: func(name string, _ int64, held time.Duration, why error) {
			set := t.nameSet(name)
			t.inst.held.Add(bg, -1, set)
			t.inst.hold.Record(bg, held.Seconds(), set)
			if cause := lease.Cause(why); cause != "released" {
				t.inst.losses.Add(bg, 1, t.nameSet(name, AttrCause.String(cause)))
			}
		},
		Renewed:     func(margin time.Duration) { t.inst.margin.Record(bg, margin.Seconds()) },
		SessionLost: func(error) { t.inst.sessionLosses.Add(bg, 1) },
		Unanswered:  func(time.Duration) { t.inst.unanswered.Add(bg, 1) },
	}
}

func (t *Telemetry) refused(guard string) {
	t.inst.refusals.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(AttrGuard.String(guard))))
}

func (t *Telemetry) outcomeUnknown() { t.inst.unkn.Add(context.Background(), 1) }
