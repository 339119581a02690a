// Package outboxprom exports a relay's events as Prometheus metrics.
//
//	reg := prometheus.NewRegistry()
//	hook, err := outboxprom.NewHook(reg)
//	…
//	relay, err := outbox.NewRelay(store, pub, outbox.Config{Hook: hook})
//
// # Metrics
//
// All names start with "outbox_":
//
//	outbox_published_total{topic}       counter   messages acknowledged by the broker
//	outbox_failed_total{topic}          counter   failed attempts that will be retried
//	outbox_dead_lettered_total{topic}   counter   messages moved to the dead letters
//	outbox_fetched_total                counter   records read from the store
//	outbox_settled_total                counter   records settled in the store
//	outbox_fenced_total                 counter   partitions lost to another relay
//	outbox_store_errors_total           counter   failed store calls (retried by the relay)
//	outbox_publish_duration_seconds     histogram one observation per published event
//	outbox_fetch_duration_seconds       histogram one observation per fetch
//	outbox_settle_duration_seconds      histogram one observation per settle
//	outbox_leases                       gauge     partition leases held now
//	outbox_lag_seconds                  gauge     age of the oldest message of the last published batch
//
// The hook only updates in-memory metrics (atomic adds and a read-locked map
// lookup per topic), so it never blocks the relay on I/O. The topic label has
// one value per topic the relay publishes to; an application with unbounded
// topic names should not use this package as is.
package outboxprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

// Namespace prefixes every metric name.
const Namespace = "outbox"

// DurationBuckets are the histogram buckets, in seconds: 1 ms to about 16 s.
var DurationBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// Metrics holds the collectors behind a hook. Use [NewHook] unless you need
// to register the collectors yourself.
type Metrics struct {
	Published       *prometheus.CounterVec
	Failed          *prometheus.CounterVec
	DeadLettered    *prometheus.CounterVec
	Fetched         prometheus.Counter
	Settled         prometheus.Counter
	Fenced          prometheus.Counter
	StoreErrors     prometheus.Counter
	PublishDuration prometheus.Histogram
	FetchDuration   prometheus.Histogram
	SettleDuration  prometheus.Histogram
	Leases          prometheus.Gauge
	Lag             prometheus.Gauge
}

// NewMetrics returns unregistered collectors.
func NewMetrics() *Metrics {
	counterVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, []string{"topic"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
	}
	histogram := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: DurationBuckets})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	}
	return &Metrics{
		Published:       counterVec("published_total", "Messages acknowledged by the broker."),
		Failed:          counterVec("failed_total", "Failed publish attempts that will be retried."),
		DeadLettered:    counterVec("dead_lettered_total", "Messages moved to the dead letters."),
		Fetched:         counter("fetched_total", "Records read from the store."),
		Settled:         counter("settled_total", "Records settled in the store."),
		Fenced:          counter("fenced_total", "Partitions lost to another relay while settling."),
		StoreErrors:     counter("store_errors_total", "Failed store calls; the relay retries them."),
		PublishDuration: histogram("publish_duration_seconds", "Duration of Publish calls, one observation per published event."),
		FetchDuration:   histogram("fetch_duration_seconds", "Duration of store fetches."),
		SettleDuration:  histogram("settle_duration_seconds", "Duration of store settlements."),
		Leases:          gauge("leases", "Partition leases held by this relay."),
		Lag:             gauge("lag_seconds", "Age of the oldest message of the last published batch."),
	}
}

// Collectors returns every collector of m.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.Published, m.Failed, m.DeadLettered, m.Fetched, m.Settled, m.Fenced, m.StoreErrors,
		m.PublishDuration, m.FetchDuration, m.SettleDuration, m.Leases, m.Lag,
	}
}

// Register registers every collector of m with reg. On an error nothing
// stays registered.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return errors.New("outboxprom: Register needs a non-nil prometheus.Registerer")
	}
	var done []prometheus.Collector
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return fmt.Errorf("outboxprom: register metrics (a second hook on the same registry? use one hook per registry): %w", err)
		}
		done = append(done, c)
	}
	return nil
}

// Hook returns the relay hook that updates m. It is safe for concurrent use
// and does not block.
func (m *Metrics) Hook() outbox.Hook {
	return func(e outbox.Event) {
		switch e.Kind {
		case outbox.EventPublished:
			m.Published.WithLabelValues(e.Topic).Add(float64(e.Count))
			m.PublishDuration.Observe(e.Duration.Seconds())
		case outbox.EventFailed:
			m.Failed.WithLabelValues(e.Topic).Add(float64(e.Count))
		case outbox.EventDeadLettered:
			m.DeadLettered.WithLabelValues(e.Topic).Add(float64(e.Count))
		case outbox.EventFetched:
			m.Fetched.Add(float64(e.Count))
			m.FetchDuration.Observe(e.Duration.Seconds())
		case outbox.EventSettled:
			m.Settled.Add(float64(e.Count))
			m.SettleDuration.Observe(e.Duration.Seconds())
		case outbox.EventLeases:
			m.Leases.Set(float64(e.Count))
		case outbox.EventFenced:
			m.Fenced.Add(float64(e.Count))
		case outbox.EventStoreError:
			m.StoreErrors.Inc()
		case outbox.EventLag:
			m.Lag.Set(e.Duration.Seconds())
		}
	}
}

// NewHook registers the outbox metrics with reg and returns the hook that
// updates them, for outbox.Config.Hook. It fails if reg already holds them
// (one hook per registry).
func NewHook(reg prometheus.Registerer) (outbox.Hook, error) {
	m := NewMetrics()
	if err := m.Register(reg); err != nil {
		return nil, err
	}
	return m.Hook(), nil
}
