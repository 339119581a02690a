package outboxprom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/health"
	"github.com/outboxrelay/outbox/metrics/backlog"
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+name, help, labels, nil)
}

var (
	outstandingDesc   = desc("outstanding_messages", "Outstanding messages per topic, as of the last backlog refresh (a lower bound when outbox_backlog_exact is 0).", "topic")
	oldestAgeDesc     = desc("oldest_message_age_seconds", "Age of the oldest outstanding message of each topic.", "topic")
	lagDesc           = desc("lag_seconds", "Age of the oldest outstanding message; 0 when none is outstanding.")
	exactDesc         = desc("backlog_exact", "1 when the last backlog refresh counted every outstanding message, 0 when it counted a sample.")
	deadLettersDesc   = desc("dead_letters", "Messages in the dead letters, counted up to the backlog monitor's limit.")
	leasesHeldDesc    = desc("leases_held", "Partition leases each live relay holds, as the store says.", "node")
	relaysLiveDesc    = desc("relays_live", "Relays with a live heartbeat in the store.")
	backlogTotalDesc  = desc("backlog_messages", "Outstanding messages of every topic, as of the last backlog refresh; 0 when the outbox is empty.")
	refreshDurDesc    = desc("backlog_refresh_duration_seconds", "Duration of the last successful backlog refresh.")
	refreshTimeDesc   = desc("backlog_refresh_timestamp_seconds", "End of the last successful backlog refresh, Unix time.")
	refreshErrorsDesc = desc("backlog_refresh_errors_total", "Failed backlog refreshes.")

	blockedDesc      = desc("blocked_destinations", "Destinations the relay holds paused because the broker refuses them.")
	blockedSinceDesc = desc("destination_blocked_since_seconds", "When each blocked destination was blocked, Unix time.", "destination")

	storeUpDesc    = desc("store_up", "1 while the relay reaches its store, 0 while it does not.")
	brokerUpDesc   = desc("broker_up", "1 while the publisher reaches its broker (or cannot tell), 0 while it does not.")
	allBlockedDesc = desc("all_destinations_blocked", "1 while every destination is blocked: at least one is, and nothing was published since the last one was.")
)

// backlogCollector reads a backlog monitor's snapshot at scrape time.
type backlogCollector struct {
	mon *backlog.Monitor
	now func() time.Time
	// seen are the topics of earlier refreshes: an emptied topic keeps its
	// series at 0, so that an alert can tell "empty" from "not scraped".
	seen *topicSet
}

// topicSet is a set of topic names safe for concurrent scrapes.
type topicSet struct {
	mu sync.Mutex
	m  map[string]bool
}

// emptied records topics and returns the earlier ones not among them.
func (s *topicSet) emptied(topics []outbox.TopicBacklog) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := make(map[string]bool, len(topics))
	for _, t := range topics {
		now[t.Topic] = true
		s.m[t.Topic] = true
	}
	var out []string
	for t := range s.m {
		if !now[t] {
			out = append(out, t)
		}
	}
	return out
}

func (c backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{outstandingDesc, oldestAgeDesc, lagDesc, exactDesc, deadLettersDesc, leasesHeldDesc,
		relaysLiveDesc, backlogTotalDesc, refreshDurDesc, refreshTimeDesc, refreshErrorsDesc} {
		ch <- d
	}
}

func (c backlogCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.mon.Snapshot()
	ch <- prometheus.MustNewConstMetric(refreshErrorsDesc, prometheus.CounterValue, float64(s.Failures))
	b := s.Backlog
	if b == nil {
		return // nothing measured yet
	}
	now := c.now()
	age := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return max(0, now.Sub(t).Seconds())
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var total int64
	for _, t := range b.Topics {
		gauge(outstandingDesc, float64(t.Outstanding), t.Topic)
		gauge(oldestAgeDesc, age(t.OldestCreatedAt), t.Topic)
		total += t.Outstanding
	}
	for _, topic := range c.seen.emptied(b.Topics) {
		gauge(outstandingDesc, 0, topic)
		gauge(oldestAgeDesc, 0, topic)
	}
	gauge(backlogTotalDesc, float64(total))
	gauge(lagDesc, age(b.OldestCreatedAt))
	exact := 0.0
	if b.Exact {
		exact = 1
	}
	gauge(exactDesc, exact)
	gauge(deadLettersDesc, float64(b.DeadLetters))
	for node, n := range b.Leases {
		gauge(leasesHeldDesc, float64(n), node)
	}
	gauge(relaysLiveDesc, float64(len(b.Leases)))
	gauge(refreshDurDesc, s.Took.Seconds())
	gauge(refreshTimeDesc, float64(s.At.UnixNano())/1e9)
}

// RegisterBacklog exports the backlog mon measures (see the package
// documentation) with reg, read from mon's last refresh at every scrape.
// It replaces outbox_lag_seconds of older versions, which froze at the
// last publish: this one is the age of the oldest outstanding message.
func RegisterBacklog(reg prometheus.Registerer, mon *backlog.Monitor) error {
	if reg == nil || mon == nil {
		return errors.New("outboxprom: RegisterBacklog needs a registerer and a backlog monitor")
	}
	return reg.Register(backlogCollector{mon: mon, now: time.Now, seen: &topicSet{m: map[string]bool{}}})
}

// BlockedReporter is what RegisterRelay needs of an *outbox.Relay.
type BlockedReporter interface {
	Blocked() []outbox.BlockedDestination
}

type relayCollector struct{ r BlockedReporter }

func (c relayCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- blockedDesc
	ch <- blockedSinceDesc
}

func (c relayCollector) Collect(ch chan<- prometheus.Metric) {
	blocked := c.r.Blocked()
	ch <- prometheus.MustNewConstMetric(blockedDesc, prometheus.GaugeValue, float64(len(blocked)))
	for _, b := range blocked {
		ch <- prometheus.MustNewConstMetric(blockedSinceDesc, prometheus.GaugeValue, float64(b.Since.UnixNano())/1e9, b.Destination)
	}
}

// RegisterRelay exports the relay's blocked destinations with reg, read at
// every scrape: outbox_blocked_destinations (from the start, at zero) and
// outbox_destination_blocked_since_seconds per blocked destination.
func RegisterRelay(reg prometheus.Registerer, r BlockedReporter) error {
	if reg == nil || r == nil {
		return errors.New("outboxprom: RegisterRelay needs a registerer and a relay")
	}
	return reg.Register(relayCollector{r})
}

// healthProbeTimeout bounds the readiness check a scrape makes.
const healthProbeTimeout = 5 * time.Second

type healthCollector struct{ c *health.Checker }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- storeUpDesc
	ch <- brokerUpDesc
	ch <- allBlockedDesc
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), healthProbeTimeout)
	defer cancel()
	r := c.c.Check(ctx)
	up := func(comp health.Component) float64 {
		if comp.Up() {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(storeUpDesc, prometheus.GaugeValue, up(r.Store))
	ch <- prometheus.MustNewConstMetric(brokerUpDesc, prometheus.GaugeValue, up(r.Broker))
	allBlocked := 0.0
	if r.AllBlocked {
		allBlocked = 1
	}
	ch <- prometheus.MustNewConstMetric(allBlockedDesc, prometheus.GaugeValue, allBlocked)
}

// RegisterHealth exports the relay's reachability of its store and broker
// (outbox_store_up, outbox_broker_up) with reg, from a readiness check at
// every scrape (the checker reuses a recent broker probe).
func RegisterHealth(reg prometheus.Registerer, c *health.Checker) error {
	if reg == nil || c == nil {
		return errors.New("outboxprom: RegisterHealth needs a registerer and a health checker")
	}
	return reg.Register(healthCollector{c})
}
