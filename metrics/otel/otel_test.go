package outboxotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics/backlog"
	outboxotel "github.com/outboxrelay/outbox/metrics/otel"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestHookRecordsPerTopic(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	hook, err := outboxotel.NewHook(mp)
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				hook(outbox.Event{Kind: outbox.EventPublished, Topic: "orders.created", Count: 3, Duration: 2 * time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventPublished, Topic: "orders.paid", Count: 1, Duration: time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventFailed, Topic: "orders.paid", Count: 2, Err: errors.New("timeout")})
				hook(outbox.Event{Kind: outbox.EventFetched, Count: 10, Duration: time.Millisecond})
				hook(outbox.Event{Kind: outbox.EventSettled, Count: 4, Duration: time.Millisecond})
			}
		})
	}
	wg.Wait()
	hook(outbox.Event{Kind: outbox.EventDeadLettered, Topic: "orders.paid", Count: 5})
	hook(outbox.Event{Kind: outbox.EventFenced, Count: 2})
	hook(outbox.Event{Kind: outbox.EventStoreError, Err: errors.New("reset")})
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 3})
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 7})
	hook(outbox.Event{Kind: outbox.EventLag, Duration: 1500 * time.Millisecond})
	hook(outbox.Event{Kind: outbox.EventHeld, Topic: "orders.paid", Count: 3})
	hook(outbox.Event{Kind: outbox.EventDuplicate, Topic: "orders.paid", Count: 2})
	hook(outbox.Event{Kind: outbox.EventBlocked, Topic: "orders.paid", Err: errors.New("no stream")})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if len(rm.ScopeMetrics) != 1 || rm.ScopeMetrics[0].Scope.Name != outboxotel.MeterName {
		t.Fatalf("scopes = %+v", rm.ScopeMetrics)
	}
	got := map[string]metricdata.Aggregation{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		got[m.Name] = m.Data
	}
	sum := func(name, topic string) int64 {
		t.Helper()
		s, ok := got[name].(metricdata.Sum[int64])
		if !ok {
			t.Fatalf("%s is %T, want a Sum[int64]", name, got[name])
		}
		var total int64
		for _, dp := range s.DataPoints {
			v, has := dp.Attributes.Value(attribute.Key("topic"))
			if topic == "" || (has && v.AsString() == topic) {
				total += dp.Value
			}
		}
		return total
	}
	for _, c := range []struct {
		name, topic string
		want        int64
	}{
		{"outbox.published", "orders.created", 2400},
		{"outbox.published", "orders.paid", 800},
		{"outbox.failed", "orders.paid", 1600},
		{"outbox.dead_lettered", "orders.paid", 5},
		{"outbox.fetched", "", 8000},
		{"outbox.settled", "", 3200},
		{"outbox.fenced", "", 2},
		{"outbox.store_errors", "", 1},
		{"outbox.held", "orders.paid", 3},
		{"outbox.duplicates", "orders.paid", 2},
		{"outbox.destination_blocks", "orders.paid", 1},
	} {
		if v := sum(c.name, c.topic); v != c.want {
			t.Errorf("%s{topic=%q} = %d, want %d", c.name, c.topic, v, c.want)
		}
	}
	for name, want := range map[string]uint64{"outbox.publish.duration": 1600, "outbox.fetch.duration": 800, "outbox.settle.duration": 800} {
		h, ok := got[name].(metricdata.Histogram[float64])
		if !ok || len(h.DataPoints) != 1 || h.DataPoints[0].Count != want {
			t.Errorf("%s = %+v, want one data point with %d records", name, got[name], want)
		}
	}
	if g, ok := got["outbox.leases"].(metricdata.Gauge[int64]); !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 7 {
		t.Errorf("outbox.leases = %+v, want 7", got["outbox.leases"])
	}
	if h, ok := got["outbox.publish.lag"].(metricdata.Histogram[float64]); !ok || len(h.DataPoints) != 1 || h.DataPoints[0].Count != 1 || h.DataPoints[0].Sum != 1.5 {
		t.Errorf("outbox.publish.lag = %+v, want one record of 1.5", got["outbox.publish.lag"])
	}
}

func TestNewHookNeedsAProvider(t *testing.T) {
	if _, err := outboxotel.NewHook(nil); err == nil {
		t.Fatal("NewHook(nil) succeeded")
	}
}

type fixedBacklog struct{ b *outbox.Backlog }

func (f fixedBacklog) Backlog(context.Context, int) (*outbox.Backlog, error) { return f.b, nil }

func TestRegisterBacklog(t *testing.T) {
	old := time.Now().Add(-time.Hour)
	mon, err := backlog.New(fixedBacklog{&outbox.Backlog{
		Topics:      []outbox.TopicBacklog{{Topic: "orders", Outstanding: 4, OldestCreatedAt: old}},
		Outstanding: 4, Exact: true, OldestCreatedAt: old, DeadLetters: 2, Leases: map[string]int{"r1": 3},
	}}, backlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	reg, err := outboxotel.RegisterBacklog(mp, mon)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	collect := func() map[string]metricdata.Aggregation {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]metricdata.Aggregation{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				got[m.Name] = m.Data
			}
		}
		return got
	}
	if got := collect(); len(got) != 0 {
		t.Errorf("before the first refresh: %v, want nothing", got)
	}
	if err := mon.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := collect()
	ints := map[string]int64{"outbox.outstanding": 4, "outbox.backlog.exact": 1, "outbox.dead_letters": 2, "outbox.leases_held": 3}
	for name, want := range ints {
		g, ok := got[name].(metricdata.Gauge[int64])
		if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != want {
			t.Errorf("%s = %+v, want %d", name, got[name], want)
		}
	}
	for _, name := range []string{"outbox.lag", "outbox.oldest_message.age"} {
		g, ok := got[name].(metricdata.Gauge[float64])
		if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value < 3600 || g.DataPoints[0].Value > 3700 {
			t.Errorf("%s = %+v, want about 3600", name, got[name])
		}
	}
}
