package outboxprom

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

// horizonScrapeTimeout bounds the horizon query of one scrape.
const horizonScrapeTimeout = 5 * time.Second

var (
	horizonSecondsDesc = prometheus.NewDesc("outbox_postgres_xmin_horizon_age_seconds",
		"How long the oldest holder of each kind (session, prepared, slot, slot_catalog) has held back the database's xmin horizon: vacuum cannot remove the rows deleted since (capture table). 0 when none; outbox status names the holder.", []string{"holder"}, nil)
	horizonXidsDesc = prometheus.NewDesc("outbox_postgres_xmin_horizon_age_xids",
		"Age in transaction IDs of the oldest holder of each kind of the database's xmin horizon (capture table). 0 when none.", []string{"holder"}, nil)
)

// horizonCollector reads a store's xmin horizon at scrape time.
type horizonCollector struct{ hr outbox.HorizonReader }

func (c horizonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- horizonSecondsDesc
	ch <- horizonXidsDesc
}

func (c horizonCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), horizonScrapeTimeout)
	defer cancel()
	hz, err := c.hr.XminHorizon(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(horizonSecondsDesc, err)
		return
	}
	secs := map[string]float64{}
	xids := map[string]float64{}
	for _, h := range hz.Holders {
		if float64(h.AgeXids) > xids[h.Kind] {
			xids[h.Kind] = float64(h.AgeXids)
		}
		if h.AgeSeconds != nil && *h.AgeSeconds > secs[h.Kind] {
			secs[h.Kind] = *h.AgeSeconds
		}
	}
	for _, k := range outbox.HorizonKinds {
		ch <- prometheus.MustNewConstMetric(horizonSecondsDesc, prometheus.GaugeValue, secs[k], k)
		ch <- prometheus.MustNewConstMetric(horizonXidsDesc, prometheus.GaugeValue, xids[k], k)
	}
}

// RegisterHorizon exports the xmin horizon of a store whose cost depends
// on the database's vacuum (outbox.HorizonReader, such as PostgreSQL with
// capture table) with reg, read at every scrape:
// outbox_postgres_xmin_horizon_age_seconds and _age_xids, one series per
// kind of holder (label holder: session, prepared, slot, slot_catalog),
// 0 when there is none. Who holds it (pid, application, state) is in
// `outbox status` and the relay's WARN log, not in labels.
func RegisterHorizon(reg prometheus.Registerer, hr outbox.HorizonReader) error {
	if reg == nil || hr == nil {
		return errors.New("outboxprom: RegisterHorizon needs a registerer and a store")
	}
	return reg.Register(horizonCollector{hr})
}
