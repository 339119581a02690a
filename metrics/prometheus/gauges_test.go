package outboxprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/health"
	"github.com/outboxrelay/outbox/metrics/backlog"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

// gather returns the families of reg by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// value returns the value of the series of family name with the given
// label value (or the only series when label is ""), and whether it exists.
func value(fams map[string]*dto.MetricFamily, name, label string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestEveryCounterAndHistogramFromZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := outboxprom.NewMetrics()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, reg)
	for _, name := range []string{"outbox_fetched_total", "outbox_settled_total", "outbox_fenced_total", "outbox_store_errors_total",
		"outbox_publish_duration_seconds", "outbox_fetch_duration_seconds", "outbox_settle_duration_seconds", "outbox_publish_lag_seconds"} {
		if v, ok := value(fams, name, ""); !ok || v != 0 {
			t.Errorf("%s before any event: %v (exported %v), want 0", name, v, ok)
		}
	}
	m.InitBacklogTopics(&outbox.Backlog{Topics: []outbox.TopicBacklog{{Topic: "orders"}}})
	hook := m.Hook()
	hook(outbox.Event{Kind: outbox.EventPublished, Topic: "invoices", Count: 2})
	hook(outbox.Event{Kind: outbox.EventDuplicate, Topic: "invoices", Count: 1})
	hook(outbox.Event{Kind: outbox.EventBlocked, Topic: "invoices", Err: errors.New("no stream")})
	hook(outbox.Event{Kind: outbox.EventHeld, Topic: "invoices", Count: 3})
	fams = gather(t, reg)
	for _, c := range []struct {
		name, topic string
		want        float64
	}{
		{"outbox_published_total", "orders", 0}, {"outbox_failed_total", "orders", 0}, {"outbox_dead_lettered_total", "orders", 0},
		{"outbox_published_total", "invoices", 2}, {"outbox_failed_total", "invoices", 0}, {"outbox_dead_lettered_total", "invoices", 0},
		{"outbox_held_total", "orders", 0}, {"outbox_duplicates_total", "orders", 0}, {"outbox_destination_blocks_total", "orders", 0},
		{"outbox_duplicates_total", "invoices", 1}, {"outbox_destination_blocks_total", "invoices", 1}, {"outbox_held_total", "invoices", 3},
	} {
		if v, ok := value(fams, c.name, c.topic); !ok || v != c.want {
			t.Errorf("%s{topic=%q} = %v (exported %v), want %v", c.name, c.topic, v, ok, c.want)
		}
	}
}

type fakeBacklog struct {
	b   *outbox.Backlog
	err error
}

func (f *fakeBacklog) Backlog(context.Context, int) (*outbox.Backlog, error) { return f.b, f.err }

func TestBacklogGauges(t *testing.T) {
	t.Parallel()
	old := time.Now().Add(-time.Hour)
	src := &fakeBacklog{}
	mon, err := backlog.New(src, backlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := outboxprom.RegisterBacklog(reg, mon); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, reg)
	if v, ok := value(fams, "outbox_backlog_refresh_errors_total", ""); !ok || v != 0 || len(fams) != 1 {
		t.Fatalf("before the first refresh: %v families, refresh errors %v (exported %v); want only the error counter, at 0", len(fams), v, ok)
	}
	src.b = &outbox.Backlog{
		Topics: []outbox.TopicBacklog{
			{Topic: "orders", Outstanding: 40, OldestCreatedAt: old},
			{Topic: "invoices", Outstanding: 2, OldestCreatedAt: old.Add(30 * time.Minute)},
		},
		Outstanding: 42, Exact: true, OldestCreatedAt: old, DeadLetters: 3,
		Leases: map[string]int{"relay-a": 5, "relay-b": 0},
	}
	if err := mon.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	src.err = errors.New("store down")
	_ = mon.Refresh(context.Background()) // the last backlog stays; the failure is counted
	fams = gather(t, reg)
	for _, c := range []struct {
		name, label string
		min, max    float64
	}{
		{"outbox_outstanding_messages", "orders", 40, 40},
		{"outbox_outstanding_messages", "invoices", 2, 2},
		{"outbox_oldest_message_age_seconds", "orders", 3600, 3700},
		{"outbox_oldest_message_age_seconds", "invoices", 1800, 1900},
		{"outbox_lag_seconds", "", 3600, 3700},
		{"outbox_backlog_exact", "", 1, 1},
		{"outbox_dead_letters", "", 3, 3},
		{"outbox_leases_held", "relay-a", 5, 5},
		{"outbox_leases_held", "relay-b", 0, 0},
		{"outbox_relays_live", "", 2, 2},
		{"outbox_backlog_messages", "", 42, 42},
		{"outbox_backlog_refresh_errors_total", "", 1, 1},
		{"outbox_backlog_refresh_timestamp_seconds", "", float64(time.Now().Add(-time.Minute).Unix()), float64(time.Now().Unix() + 1)},
	} {
		if v, ok := value(fams, c.name, c.label); !ok || v < c.min || v > c.max {
			t.Errorf("%s{%s} = %v (exported %v), want between %v and %v", c.name, c.label, v, ok, c.min, c.max)
		}
	}
	if _, ok := value(fams, "outbox_backlog_refresh_duration_seconds", ""); !ok {
		t.Error("no outbox_backlog_refresh_duration_seconds")
	}

	src.b, src.err = &outbox.Backlog{Exact: true, Topics: []outbox.TopicBacklog{}}, nil
	if err := mon.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	fams = gather(t, reg)
	if v, _ := value(fams, "outbox_lag_seconds", ""); v != 0 {
		t.Errorf("outbox_lag_seconds with nothing outstanding = %v, want 0", v)
	}
	// Emptied topics keep their series at 0, and the total exists at 0:
	// an alert tells an empty outbox from a relay not scraped.
	for _, c := range []struct{ name, label string }{
		{"outbox_outstanding_messages", "orders"}, {"outbox_outstanding_messages", "invoices"},
		{"outbox_oldest_message_age_seconds", "orders"}, {"outbox_backlog_messages", ""},
	} {
		if v, ok := value(fams, c.name, c.label); !ok || v != 0 {
			t.Errorf("empty outbox: %s{%s} = %v (exported %v), want 0", c.name, c.label, v, ok)
		}
	}
}

type blockedRelay struct{ blocked []outbox.BlockedDestination }

func (r *blockedRelay) Blocked() []outbox.BlockedDestination { return r.blocked }
func (r *blockedRelay) Running() bool                        { return true }
func (r *blockedRelay) LastStoreContact() time.Time          { return time.Now() }
func (r *blockedRelay) Config() outbox.Config                { return outbox.Config{}.WithDefaults() }

type downBroker struct{}

func (downBroker) Publish(_ context.Context, msgs []*outbox.Message) []error {
	return make([]error, len(msgs))
}
func (downBroker) Close() error                 { return nil }
func (downBroker) Health(context.Context) error { return errors.New("not connected") }

func TestRelayAndHealthGauges(t *testing.T) {
	t.Parallel()
	r := &blockedRelay{}
	reg := prometheus.NewRegistry()
	if err := outboxprom.RegisterRelay(reg, r); err != nil {
		t.Fatal(err)
	}
	c, err := health.New(r, downBroker{}, health.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := outboxprom.RegisterHealth(reg, c); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outbox_all_destinations_blocked 1 while every destination is blocked: at least one is, and nothing was published since the last one was.
# TYPE outbox_all_destinations_blocked gauge
outbox_all_destinations_blocked 0
# HELP outbox_blocked_destinations Destinations the relay holds paused because the broker refuses them.
# TYPE outbox_blocked_destinations gauge
outbox_blocked_destinations 0
# HELP outbox_broker_up 1 while the publisher reaches its broker (or cannot tell), 0 while it does not.
# TYPE outbox_broker_up gauge
outbox_broker_up 0
# HELP outbox_store_up 1 while the relay reaches its store, 0 while it does not.
# TYPE outbox_store_up gauge
outbox_store_up 1
`)); err != nil {
		t.Error(err)
	}
	since := time.Unix(1700000000, 0)
	r.blocked = []outbox.BlockedDestination{{Destination: "orders", Since: since, LastError: "no stream"}}
	fams := gather(t, reg)
	if v, _ := value(fams, "outbox_blocked_destinations", ""); v != 1 {
		t.Errorf("outbox_blocked_destinations = %v, want 1", v)
	}
	if v, _ := value(fams, "outbox_all_destinations_blocked", ""); v != 1 {
		t.Errorf("outbox_all_destinations_blocked with one destination blocked and nothing published = %v, want 1", v)
	}
	if v, _ := value(fams, "outbox_destination_blocked_since_seconds", "orders"); v != 1700000000 {
		t.Errorf("outbox_destination_blocked_since_seconds{orders} = %v, want 1700000000", v)
	}
	for _, err := range []error{outboxprom.RegisterRelay(nil, r), outboxprom.RegisterHealth(reg, nil), outboxprom.RegisterBacklog(reg, nil)} {
		if err == nil {
			t.Error("a Register function accepted a nil argument")
		}
	}
}
