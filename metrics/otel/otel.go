// Package outboxotel exports a relay's events as OpenTelemetry metrics,
// through the metric API (go.opentelemetry.io/otel/metric); the application
// chooses the SDK and exporter.
//
//	hook, err := outboxotel.NewHook(otel.GetMeterProvider())
//	…
//	relay, err := outbox.NewRelay(store, pub, outbox.Config{Hook: hook})
//
// # Instruments
//
// The meter is named [MeterName]. The instruments mirror package
// outboxprom's metrics:
//
//	outbox.published        counter   {message}  attribute topic
//	outbox.failed           counter   {message}  attribute topic; attempts to retry
//	outbox.dead_lettered    counter   {message}  attribute topic
//	outbox.held             counter   {message}  attribute topic; failed permanently, holding their key
//	outbox.duplicates       counter   {message}  attribute topic; acknowledged as duplicates
//	outbox.destination_blocks counter {block}    attribute topic; the destination was paused
//	outbox.fetched          counter   {record}
//	outbox.settled          counter   {record}
//	outbox.fenced           counter   {partition}
//	outbox.store_errors     counter   {error}
//	outbox.publish.duration histogram s          one record per published event
//	outbox.fetch.duration   histogram s
//	outbox.settle.duration  histogram s
//	outbox.publish.lag      histogram s          age of each published batch's oldest message when acknowledged
//	outbox.leases           gauge     {partition}
//
// [RegisterBacklog] adds observable gauges read from a backlog monitor
// (package metrics/backlog), as of its last refresh, ages computed at
// collection time:
//
//	outbox.outstanding          gauge {message}    attribute topic; a lower bound when outbox.backlog.exact is 0
//	outbox.oldest_message.age   gauge s            attribute topic
//	outbox.lag                  gauge s            age of the oldest outstanding message, 0 when none
//	outbox.backlog.exact        gauge {bool}       1 when every outstanding message was counted
//	outbox.dead_letters         gauge {message}
//	outbox.leases_held          gauge {partition}  attribute node: leases each live relay holds
//
// The hook only records into the SDK's in-memory aggregations, so it never
// waits on I/O; with the no-op provider it does nothing.
package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxrelay/outbox"
)

// MeterName is the instrumentation scope of the meter NewHook creates.
const MeterName = "github.com/outboxrelay/outbox"

// DurationBoundaries are the histogram bucket boundaries, in seconds: 1 ms
// to about 16 s, as in package outboxprom.
var DurationBoundaries = []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}

// LagBoundaries are the bucket boundaries of outbox.publish.lag, in
// seconds: 1 ms to an hour, as in package outboxprom.
var LagBoundaries = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

type instruments struct {
	published, failed, dead               metric.Int64Counter
	held, duplicates, blocks              metric.Int64Counter
	fetched, settled, fenced, storeErrors metric.Int64Counter
	publishDur, fetchDur, settleDur, lag  metric.Float64Histogram
	leases                                metric.Int64Gauge
	topics                                sync.Map // topic → metric.MeasurementOption
}

// NewHook creates the outbox instruments on a meter of mp and returns the
// hook that records into them, for outbox.Config.Hook. The hook is safe for
// concurrent use and does not block.
func NewHook(mp metric.MeterProvider) (outbox.Hook, error) {
	if mp == nil {
		return nil, errors.New("outboxotel: NewHook needs a non-nil metric.MeterProvider (otel.GetMeterProvider() for the global one)")
	}
	m := mp.Meter(MeterName)
	var (
		in   instruments
		errs []error
	)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	in.published = counter("outbox.published", "{message}", "Messages acknowledged by the broker.")
	in.failed = counter("outbox.failed", "{message}", "Failed publish attempts that will be retried.")
	in.dead = counter("outbox.dead_lettered", "{message}", "Messages moved to the dead letters.")
	in.held = counter("outbox.held", "{message}", "Messages that failed permanently and hold their key (OnPermanent hold).")
	in.duplicates = counter("outbox.duplicates", "{message}", "Messages the broker acknowledged as duplicates of messages it had stored.")
	in.blocks = counter("outbox.destination_blocks", "{block}", "Times the destination was refused as a whole by the broker and paused.")
	in.fetched = counter("outbox.fetched", "{record}", "Records read from the store.")
	in.settled = counter("outbox.settled", "{record}", "Records settled in the store.")
	in.fenced = counter("outbox.fenced", "{partition}", "Partitions lost to another relay while settling.")
	in.storeErrors = counter("outbox.store_errors", "{error}", "Failed store calls; the relay retries them.")
	in.publishDur = histogram("outbox.publish.duration", "Duration of Publish calls, one record per published event.", DurationBoundaries...)
	in.fetchDur = histogram("outbox.fetch.duration", "Duration of store fetches.", DurationBoundaries...)
	in.settleDur = histogram("outbox.settle.duration", "Duration of store settlements.", DurationBoundaries...)
	in.lag = histogram("outbox.publish.lag", "Age of the oldest message of each published batch when the broker acknowledged it.", LagBoundaries...)
	var err error
	in.leases, err = m.Int64Gauge("outbox.leases", metric.WithUnit("{partition}"), metric.WithDescription("Partition leases held by this relay."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outboxotel: create instruments: %w", err)
	}
	return in.hook, nil
}

// topic returns the measurement option carrying the topic attribute, built
// once per topic.
func (in *instruments) topic(t string) metric.MeasurementOption {
	if o, ok := in.topics.Load(t); ok {
		return o.(metric.MeasurementOption)
	}
	o, _ := in.topics.LoadOrStore(t, metric.WithAttributeSet(attribute.NewSet(attribute.String("topic", t))))
	return o.(metric.MeasurementOption)
}

func (in *instruments) hook(e outbox.Event) {
	ctx := context.Background()
	switch e.Kind {
	case outbox.EventPublished:
		in.published.Add(ctx, int64(e.Count), in.topic(e.Topic))
		in.publishDur.Record(ctx, e.Duration.Seconds())
	case outbox.EventFailed:
		in.failed.Add(ctx, int64(e.Count), in.topic(e.Topic))
	case outbox.EventDeadLettered:
		in.dead.Add(ctx, int64(e.Count), in.topic(e.Topic))
	case outbox.EventFetched:
		in.fetched.Add(ctx, int64(e.Count))
		in.fetchDur.Record(ctx, e.Duration.Seconds())
	case outbox.EventSettled:
		in.settled.Add(ctx, int64(e.Count))
		in.settleDur.Record(ctx, e.Duration.Seconds())
	case outbox.EventLeases:
		in.leases.Record(ctx, int64(e.Count))
	case outbox.EventFenced:
		in.fenced.Add(ctx, int64(e.Count))
	case outbox.EventStoreError:
		in.storeErrors.Add(ctx, 1)
	case outbox.EventLag:
		in.lag.Record(ctx, e.Duration.Seconds())
	case outbox.EventHeld:
		in.held.Add(ctx, int64(e.Count), in.topic(e.Topic))
	case outbox.EventDuplicate:
		in.duplicates.Add(ctx, int64(e.Count), in.topic(e.Topic))
	case outbox.EventBlocked:
		in.blocks.Add(ctx, 1, in.topic(e.Topic))
	}
}
