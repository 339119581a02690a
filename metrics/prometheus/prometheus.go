// Package outboxprom exports a relay's events, its store's backlog and its
// readiness as Prometheus metrics.
//
//	reg := prometheus.NewRegistry()
//	m := outboxprom.NewMetrics()
//	err := m.Register(reg)
//	relay, err := outbox.NewRelay(store, pub, outbox.Config{Hook: m.Hook()})
//	// Gauges from the store, refreshed on an interval (package metrics/backlog):
//	mon, err := backlog.New(store, backlog.Options{OnRefresh: m.InitBacklogTopics})
//	err = outboxprom.RegisterBacklog(reg, mon)
//	// Blocked destinations, store and broker reachability:
//	err = outboxprom.RegisterRelay(reg, relay)
//	err = outboxprom.RegisterHealth(reg, checker) // package health
//
// # Metrics
//
// All names start with "outbox_". From the relay's events ([Metrics]),
// every one exported from the start, at zero:
//
//	outbox_published_total{topic}       counter   messages acknowledged by the broker
//	outbox_failed_total{topic}          counter   failed attempts that will be retried
//	outbox_dead_lettered_total{topic}   counter   messages moved to the dead letters
//	outbox_held_total{topic}            counter   messages that failed permanently and hold their key (OnPermanent hold)
//	outbox_duplicates_total{topic}      counter   messages the broker acknowledged as duplicates (counted as published too)
//	outbox_destination_blocks_total{topic} counter times the destination was found blocked (paused)
//	outbox_fetched_total                counter   records read from the store
//	outbox_settled_total                counter   records settled in the store
//	outbox_fenced_total                 counter   partitions lost to another relay
//	outbox_store_errors_total           counter   failed store calls (retried by the relay)
//	outbox_publish_duration_seconds     histogram one observation per published event
//	outbox_fetch_duration_seconds       histogram one observation per fetch
//	outbox_settle_duration_seconds      histogram one observation per settle
//	outbox_publish_lag_seconds          histogram age of each published batch's oldest message when acknowledged
//	outbox_leases                       gauge     partition leases this relay holds
//
// The topic-labelled counters start at zero for a topic as soon as the
// relay knows it: from the store's backlog ([Metrics.InitBacklogTopics]),
// from [Metrics.InitTopic], or at its first event.
//
// From the store's backlog ([RegisterBacklog]), as of the monitor's last
// refresh (ages are computed at scrape time, so they keep growing while a
// message is stuck, even if the store cannot be reached):
//
//	outbox_outstanding_messages{topic}          gauge   messages waiting to be published (see outbox_backlog_exact)
//	outbox_oldest_message_age_seconds{topic}    gauge   age of the topic's oldest outstanding message
//	outbox_lag_seconds                          gauge   age of the oldest outstanding message, 0 when none
//	outbox_backlog_exact                        gauge   1 when every outstanding message was counted, 0 for a sample
//	outbox_dead_letters                         gauge   messages in the dead letters (counted up to the monitor's limit)
//	outbox_leases_held{node}                    gauge   partition leases each live relay holds
//	outbox_relays_live                          gauge   relays with a live heartbeat
//	outbox_backlog_messages                     gauge   outstanding messages of every topic, 0 when the outbox is empty
//	outbox_backlog_refresh_duration_seconds     gauge   duration of the last refresh
//	outbox_backlog_refresh_timestamp_seconds    gauge   end of the last successful refresh (Unix time)
//	outbox_backlog_refresh_errors_total         counter failed refreshes
//
// Every series exists from the first refresh on: a topic whose messages
// were all published keeps outbox_outstanding_messages{topic} at 0 (a
// relay that never saw the topic has no series for it: alert on
// outbox_backlog_messages to tell an empty outbox from a missing scrape).
//
// The store's figures are the same for every relay of one outbox: aggregate
// them with max, not sum.
//
// From the relay ([RegisterRelay]) and its readiness ([RegisterHealth]):
//
//	outbox_blocked_destinations                            gauge  destinations the relay holds paused
//	outbox_destination_blocked_since_seconds{destination}  gauge  when each was blocked (Unix time)
//	outbox_store_up                                   gauge  1 while the relay reaches its store
//	outbox_broker_up                                  gauge  1 while the publisher reaches its broker
//	outbox_all_destinations_blocked                   gauge  1 while every destination is blocked (nothing goes out)
//
// The hook only updates in-memory metrics (atomic adds and a read-locked map
// lookup per topic), so it never blocks the relay on I/O. The topic label has
// one value per topic the relay publishes to; an application with unbounded
// topic names should not use this package as is.
package outboxprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

// Namespace prefixes every metric name.
const Namespace = "outbox"

// DurationBuckets are the histogram buckets, in seconds: 1 ms to about 16 s.
var DurationBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// LagBuckets are the buckets of outbox_publish_lag_seconds: 1 ms to an
// hour.
var LagBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// Metrics holds the collectors behind a hook. Use [NewHook] unless you need
// to register the collectors yourself.
type Metrics struct {
	Published       *prometheus.CounterVec
	Failed          *prometheus.CounterVec
	DeadLettered    *prometheus.CounterVec
	Held            *prometheus.CounterVec
	Duplicates      *prometheus.CounterVec
	Blocks          *prometheus.CounterVec
	Fetched         prometheus.Counter
	Settled         prometheus.Counter
	Fenced          prometheus.Counter
	StoreErrors     prometheus.Counter
	PublishDuration prometheus.Histogram
	FetchDuration   prometheus.Histogram
	SettleDuration  prometheus.Histogram
	PublishLag      prometheus.Histogram
	Leases          prometheus.Gauge

	topics sync.Map // topics whose counters InitTopic exported
}

// NewMetrics returns unregistered collectors.
func NewMetrics() *Metrics {
	counterVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, []string{"topic"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	}
	return &Metrics{
		Published:       counterVec("published_total", "Messages acknowledged by the broker."),
		Failed:          counterVec("failed_total", "Failed publish attempts that will be retried."),
		DeadLettered:    counterVec("dead_lettered_total", "Messages moved to the dead letters."),
		Held:            counterVec("held_total", "Messages that failed permanently and hold their key (OnPermanent hold)."),
		Duplicates:      counterVec("duplicates_total", "Messages the broker acknowledged as duplicates of messages it had stored."),
		Blocks:          counterVec("destination_blocks_total", "Times the destination was refused as a whole by the broker and paused."),
		Fetched:         counter("fetched_total", "Records read from the store."),
		Settled:         counter("settled_total", "Records settled in the store."),
		Fenced:          counter("fenced_total", "Partitions lost to another relay while settling."),
		StoreErrors:     counter("store_errors_total", "Failed store calls; the relay retries them."),
		PublishDuration: histogram("publish_duration_seconds", "Duration of Publish calls, one observation per published event.", DurationBuckets),
		FetchDuration:   histogram("fetch_duration_seconds", "Duration of store fetches.", DurationBuckets),
		SettleDuration:  histogram("settle_duration_seconds", "Duration of store settlements.", DurationBuckets),
		PublishLag:      histogram("publish_lag_seconds", "Age of the oldest message of each published batch when the broker acknowledged it.", LagBuckets),
		Leases:          gauge("leases", "Partition leases held by this relay."),
	}
}

// Collectors returns every collector of m.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.Published, m.Failed, m.DeadLettered, m.Held, m.Duplicates, m.Blocks, m.Fetched, m.Settled, m.Fenced, m.StoreErrors,
		m.PublishDuration, m.FetchDuration, m.SettleDuration, m.PublishLag, m.Leases,
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
		if e.Topic != "" {
			m.InitTopic(e.Topic) // its other counters from zero too
		}
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
			m.PublishLag.Observe(e.Duration.Seconds())
		case outbox.EventHeld:
			m.Held.WithLabelValues(e.Topic).Add(float64(e.Count))
		case outbox.EventDuplicate:
			m.Duplicates.WithLabelValues(e.Topic).Add(float64(e.Count))
		case outbox.EventBlocked:
			m.Blocks.WithLabelValues(e.Topic).Inc()
		}
	}
}

// InitTopic exports the topic-labelled counters of each topic at zero, so
// that their first increase is seen by rate() and increase(). It is cheap
// for a topic already exported.
func (m *Metrics) InitTopic(topics ...string) {
	for _, t := range topics {
		if _, seen := m.topics.Load(t); seen {
			continue
		}
		m.topics.Store(t, struct{}{})
		for _, v := range []*prometheus.CounterVec{m.Published, m.Failed, m.DeadLettered, m.Held, m.Duplicates, m.Blocks} {
			v.WithLabelValues(t)
		}
	}
}

// InitBacklogTopics calls InitTopic with the topics of b: pass it as the
// backlog monitor's OnRefresh (package metrics/backlog), so that every
// topic with outstanding messages has its counters from zero before its
// first message is published.
func (m *Metrics) InitBacklogTopics(b *outbox.Backlog) {
	for _, t := range b.Topics {
		m.InitTopic(t.Topic)
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
