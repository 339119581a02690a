package outboxprom

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

// slotScrapeTimeout bounds the slot query of one scrape.
const slotScrapeTimeout = 5 * time.Second

var (
	slotLagBytesDesc = prometheus.NewDesc("outbox_wal_slot_lag_bytes",
		"WAL written since the replication slot's confirmed position, which the server keeps for it (capture wal).", []string{"slot"}, nil)
	slotLagSecondsDesc = prometheus.NewDesc("outbox_wal_slot_lag_seconds",
		"How long ago the oldest transaction not yet confirmed committed (capture wal).", []string{"slot"}, nil)
	slotHeldDesc = prometheus.NewDesc("outbox_wal_slot_held",
		"1 while this relay streams from the replication slot, 0 while it stands by (capture wal).", []string{"slot"}, nil)
	slotLostDesc = prometheus.NewDesc("outbox_wal_slot_lost",
		"1 when PostgreSQL invalidated the replication slot (wal_status lost): messages were lost (capture wal).", []string{"slot"}, nil)
	slotSafeDesc = prometheus.NewDesc("outbox_wal_slot_safe_bytes",
		"WAL that may still be written before PostgreSQL invalidates the slot (max_slot_wal_keep_size); absent when unlimited.", []string{"slot"}, nil)
	slotParkedDesc = prometheus.NewDesc("outbox_wal_parked_messages",
		"Messages parked out of the relay's full buffer into the parked table (nothing was published for a while: a blocked destination, keys waiting for retries), waiting there for their destination (capture wal).", []string{"slot"}, nil)
)

// slotCollector reads a store's replication slot at scrape time.
type slotCollector struct{ sr outbox.SlotReader }

func (c slotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{slotLagBytesDesc, slotLagSecondsDesc, slotHeldDesc, slotLostDesc, slotSafeDesc, slotParkedDesc} {
		ch <- d
	}
}

func (c slotCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), slotScrapeTimeout)
	defer cancel()
	st, err := c.sr.SlotStatus(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(slotLagBytesDesc, err)
		return
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.Name)
	}
	gauge(slotLagBytesDesc, float64(st.LagBytes))
	if st.LagSeconds != nil {
		gauge(slotLagSecondsDesc, *st.LagSeconds)
	}
	gauge(slotHeldDesc, b2f(st.Held))
	gauge(slotLostDesc, b2f(st.WALStatus == "lost"))
	if st.SafeWALBytes != nil {
		gauge(slotSafeDesc, float64(*st.SafeWALBytes))
	}
	gauge(slotParkedDesc, float64(st.Parked))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// RegisterSlot exports the replication slot of a store that captures from
// the WAL (outbox.SlotReader, such as PostgreSQL with capture wal) with
// reg, read at every scrape: outbox_wal_slot_lag_bytes, _lag_seconds,
// _held, _lost and _safe_bytes, and outbox_wal_parked_messages, labelled
// by slot.
func RegisterSlot(reg prometheus.Registerer, sr outbox.SlotReader) error {
	if reg == nil || sr == nil {
		return errors.New("outboxprom: RegisterSlot needs a registerer and a store")
	}
	return reg.Register(slotCollector{sr})
}
