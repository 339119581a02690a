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
	if g, ok := got["outbox.lag"].(metricdata.Gauge[float64]); !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 1.5 {
		t.Errorf("outbox.lag = %+v, want 1.5", got["outbox.lag"])
	}
}

func TestNewHookNeedsAProvider(t *testing.T) {
	if _, err := outboxotel.NewHook(nil); err == nil {
		t.Fatal("NewHook(nil) succeeded")
	}
}
