package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxrelay/outbox/metrics/backlog"
)

// RegisterBacklog creates the backlog's observable gauges (see the package
// documentation) on a meter of mp, observed from mon's last refresh at
// each collection. Unregister the returned registration to stop.
func RegisterBacklog(mp metric.MeterProvider, mon *backlog.Monitor) (metric.Registration, error) {
	if mp == nil || mon == nil {
		return nil, errors.New("outboxotel: RegisterBacklog needs a metric.MeterProvider and a backlog monitor")
	}
	m := mp.Meter(MeterName)
	var errs []error
	intGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	floatGauge := func(name, desc string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	outstanding := intGauge("outbox.outstanding", "{message}", "Outstanding messages per topic (a lower bound when outbox.backlog.exact is 0).")
	exact := intGauge("outbox.backlog.exact", "{bool}", "1 when the last backlog refresh counted every outstanding message.")
	dead := intGauge("outbox.dead_letters", "{message}", "Messages in the dead letters, counted up to the monitor's limit.")
	leases := intGauge("outbox.leases_held", "{partition}", "Partition leases each live relay holds.")
	oldest := floatGauge("outbox.oldest_message.age", "Age of the oldest outstanding message of each topic.")
	lag := floatGauge("outbox.lag", "Age of the oldest outstanding message; 0 when none.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outboxotel: create backlog instruments: %w", err)
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		b := mon.Snapshot().Backlog
		if b == nil {
			return nil
		}
		now := time.Now()
		age := func(t time.Time) float64 {
			if t.IsZero() {
				return 0
			}
			return max(0, now.Sub(t).Seconds())
		}
		for _, t := range b.Topics {
			attrs := metric.WithAttributes(attribute.String("topic", t.Topic))
			o.ObserveInt64(outstanding, t.Outstanding, attrs)
			o.ObserveFloat64(oldest, age(t.OldestCreatedAt), attrs)
		}
		o.ObserveFloat64(lag, age(b.OldestCreatedAt))
		ex := int64(0)
		if b.Exact {
			ex = 1
		}
		o.ObserveInt64(exact, ex)
		o.ObserveInt64(dead, b.DeadLetters)
		for node, n := range b.Leases {
			o.ObserveInt64(leases, int64(n), metric.WithAttributes(attribute.String("node", node)))
		}
		return nil
	}, outstanding, exact, dead, leases, oldest, lag)
}
