package fenceprom

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

// Metrics holds the collectors. It is a prometheus.Collector: register it
// on the service's registry. It is safe for concurrent use.
type Metrics struct {
	label func(string) string

	held, waiting  *prometheus.GaugeVec
	acquire, hold  *prometheus.HistogramVec
	lost           *prometheus.CounterVec
	margin         prometheus.Histogram
	sessionsLost   prometheus.Counter
	unanswered     prometheus.Counter
	refused        *prometheus.CounterVec
	outcomeUnknown prometheus.Counter
	collectors     []prometheus.Collector
}

// Option configures New.
type Option func(*Metrics) error

// WithNameLabel maps each lock name to the value of the name label, to
// keep the number of series bounded when names are not (say
// "shards/123456" to "shards"). The default keeps names as they are. f
// must be safe for concurrent use.
func WithNameLabel(f func(name string) string) Option {
	return func(m *Metrics) error {
		if f == nil {
			return errors.New("fenceprom: nil name label func")
		}
		m.label = f
		return nil
	}
}

// New builds the collectors. A bad option gives an error wrapping
// fence.ErrInvalidArgument.
func New(opts ...Option) (*Metrics, error) {
	m := &Metrics{label: func(n string) string { return n }}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("fenceprom: %w: nil Option", fence.ErrInvalidArgument)
		}
		if err := opt(m); err != nil {
			return nil, fmt.Errorf("%w: %w", fence.ErrInvalidArgument, err)
		}
	}
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "leasefence_lock_held",
		Help: "Locks held by this process now."}, []string{"name"})
	m.waiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "leasefence_lock_waiting",
		Help: "Lock calls of this process waiting behind another holder now."}, []string{"name"})
	m.acquire = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "leasefence_lock_acquire_seconds",
		Help: "Time to take a lock, waiting included.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"name"})
	m.hold = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "leasefence_lock_hold_seconds",
		Help: "How long locks were held.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 12)}, []string{"name"})
	m.lost = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leasefence_lock_lost_total",
		Help: "Locks lost, by cause."}, []string{"name", "cause"})
	m.margin = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leasefence_session_keepalive_margin_seconds",
		Help:    "At each keep-alive answer, the session's local deadline minus now: the early-warning budget.",
		Buckets: prometheus.LinearBuckets(0.5, 0.5, 20)})
	m.sessionsLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "leasefence_sessions_lost_total",
		Help: "Sessions whose lease was lost."})
	m.unanswered = prometheus.NewCounter(prometheus.CounterOpts{Name: "leasefence_session_grant_unanswered_total",
		Help: "Times a new session's lease grant had gone unanswered by etcd (after 2 s, then every 10 s)."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leasefence_fence_refused_total",
		Help: "Writes refused by a fence, by guard."}, []string{"guard"})
	m.outcomeUnknown = prometheus.NewCounter(prometheus.CounterOpts{Name: "leasefence_fence_outcome_unknown_total",
		Help: "Fenced writes whose outcome is unknown (no answer)."})
	m.collectors = []prometheus.Collector{m.held, m.waiting, m.acquire, m.hold, m.lost, m.margin, m.sessionsLost, m.unanswered, m.refused, m.outcomeUnknown}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}

// LeaseHooks returns hooks for lease.WithHooks. One Metrics may serve any
// number of sessions.
func (m *Metrics) LeaseHooks() *lease.Hooks {
	return &lease.Hooks{
		Waiting: func(name string, delta int) { m.waiting.WithLabelValues(m.label(name)).Add(float64(delta)) },
		Acquired: func(name string, _ int64, waited time.Duration) {
			n := m.label(name)
			m.held.WithLabelValues(n).Inc()
			m.acquire.WithLabelValues(n).Observe(waited.Seconds())
		},
		Ended: func(name string, _ int64, held time.Duration, why error) {
			n := m.label(name)
			m.held.WithLabelValues(n).Dec()
			m.hold.WithLabelValues(n).Observe(held.Seconds())
			if cause := lease.Cause(why); cause != "released" {
				m.lost.WithLabelValues(n, cause).Inc()
			}
		},
		Renewed:     func(margin time.Duration) { m.margin.Observe(margin.Seconds()) },
		SessionLost: func(error) { m.sessionsLost.Inc() },
		Unanswered:  func(time.Duration) { m.unanswered.Inc() },
	}
}

// FenceHooks returns hooks for fence.Txn.WithHooks, sqlfence.WithHooks,
// objectfence.WithHooks, fencehttp.WithHooks and fencegrpc.WithHooks.
func (m *Metrics) FenceHooks() *fence.Hooks {
	return &fence.Hooks{
		Refused:        func(guard string) { m.refused.WithLabelValues(guard).Inc() },
		OutcomeUnknown: func() { m.outcomeUnknown.Inc() },
	}
}
