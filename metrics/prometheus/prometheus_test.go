package outboxprom_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestHookCountsPerTopic(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := outboxprom.NewMetrics()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	hook := m.Hook()

	// Many goroutines at once, as the relay's workers call it.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				hook(outbox.Event{Kind: outbox.EventPublished, Topic: "orders.created", Count: 3, Duration: 2 * time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventPublished, Topic: "orders.paid", Count: 1, Duration: time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventFailed, Topic: "orders.paid", Count: 2, Err: errors.New("nats: timeout")})
				hook(outbox.Event{Kind: outbox.EventFetched, Count: 10, Duration: time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventSettled, Count: 4, Duration: time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventLeases, Count: i})
			}
		})
	}
	wg.Wait()
	hook(outbox.Event{Kind: outbox.EventDeadLettered, Topic: "orders.paid", Count: 5})
	hook(outbox.Event{Kind: outbox.EventFenced, Count: 2})
	hook(outbox.Event{Kind: outbox.EventStoreError, Err: errors.New("connection reset")})
	hook(outbox.Event{Kind: outbox.EventLag, Duration: 1500 * time.Millisecond})
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 7})
	hook(outbox.Event{Kind: outbox.EventKind(999)}) // unknown kinds are ignored

	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"published orders.created", testutil.ToFloat64(m.Published.WithLabelValues("orders.created")), 8 * 100 * 3},
		{"published orders.paid", testutil.ToFloat64(m.Published.WithLabelValues("orders.paid")), 8 * 100},
		{"failed orders.paid", testutil.ToFloat64(m.Failed.WithLabelValues("orders.paid")), 8 * 100 * 2},
		{"dead orders.paid", testutil.ToFloat64(m.DeadLettered.WithLabelValues("orders.paid")), 5},
		{"fetched", testutil.ToFloat64(m.Fetched), 8 * 100 * 10},
		{"settled", testutil.ToFloat64(m.Settled), 8 * 100 * 4},
		{"fenced", testutil.ToFloat64(m.Fenced), 2},
		{"store errors", testutil.ToFloat64(m.StoreErrors), 1},
		{"leases", testutil.ToFloat64(m.Leases), 7},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// The histograms saw one observation per event.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetType().String() == "HISTOGRAM" {
			counts[f.GetName()] = f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	for name, n := range map[string]uint64{
		"outbox_publish_duration_seconds": 8 * 100 * 2,
		"outbox_fetch_duration_seconds":   8 * 100,
		"outbox_settle_duration_seconds":  8 * 100,
		"outbox_publish_lag_seconds":      1,
	} {
		if counts[name] != n {
			t.Errorf("%s has %d observations, want %d", name, counts[name], n)
		}
	}
}

func TestNewHookTwiceOnOneRegistryFails(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	hook, err := outboxprom.NewHook(reg)
	if err != nil {
		t.Fatal(err)
	}
	hook(outbox.Event{Kind: outbox.EventPublished, Topic: "a", Count: 1})
	if _, err := outboxprom.NewHook(reg); err == nil {
		t.Fatal("second NewHook on the same registry succeeded")
	}
	// The failed registration left nothing behind: the first hook's metrics
	// are still the only ones.
	n, err := testutil.GatherAndCount(reg, "outbox_published_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("outbox_published_total has %d series, want 1", n)
	}
	if _, err := outboxprom.NewHook(nil); err == nil {
		t.Fatal("NewHook(nil) succeeded")
	}
}
