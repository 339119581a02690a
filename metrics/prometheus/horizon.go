package outboxprom

import (
	"context"
	"errors"
	"sync"
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

// horizonReadEvery is how often the collector reads the horizon at most:
// scrapes closer together share a reading, with the holders' ages in
// seconds advanced by the time since it was read. An alert on the horizon
// is about minutes; a scraper polling every 100 ms must not add a
// catalogue query per poll to the database the relay drains.
var horizonReadEvery = 2 * time.Second

// horizonCollector reads a store's xmin horizon at scrape time, at most
// every horizonReadEvery.
type horizonCollector struct {
	hr outbox.HorizonReader

	mu   sync.Mutex
	last *outbox.XminHorizon
	at   time.Time
}

// read returns the horizon, read again when the last reading is older
// than horizonReadEvery, and how long ago it was read.
func (c *horizonCollector) read() (*outbox.XminHorizon, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.at) < horizonReadEvery {
		return c.last, time.Since(c.at), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), horizonScrapeTimeout)
	defer cancel()
	hz, err := c.hr.XminHorizon(ctx)
	if err != nil {
		c.last = nil
		return nil, 0, err
	}
	c.last, c.at = hz, time.Now()
	return hz, 0, nil
}

func (c *horizonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- horizonSecondsDesc
	ch <- horizonXidsDesc
}

func (c *horizonCollector) Collect(ch chan<- prometheus.Metric) {
	hz, ago, err := c.read()
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
		if h.AgeSeconds != nil && *h.AgeSeconds+ago.Seconds() > secs[h.Kind] {
			secs[h.Kind] = *h.AgeSeconds + ago.Seconds()
		}
	}
	for _, k := range outbox.HorizonKinds {
		ch <- prometheus.MustNewConstMetric(horizonSecondsDesc, prometheus.GaugeValue, secs[k], k)
		ch <- prometheus.MustNewConstMetric(horizonXidsDesc, prometheus.GaugeValue, xids[k], k)
	}
}

// RegisterHorizon exports the xmin horizon of a store whose cost depends
// on the database's vacuum (outbox.HorizonReader, such as PostgreSQL with
// capture table) with reg, read at scrape time (at most every 2 s: closer
// scrapes share a reading, its ages in seconds advanced):
// outbox_postgres_xmin_horizon_age_seconds and _age_xids, one series per
// kind of holder (label holder: session, prepared, slot, slot_catalog),
// 0 when there is none. Who holds it (pid, application, state) is in
// `outbox status` and the relay's WARN log, not in labels.
func RegisterHorizon(reg prometheus.Registerer, hr outbox.HorizonReader) error {
	if reg == nil || hr == nil {
		return errors.New("outboxprom: RegisterHorizon needs a registerer and a store")
	}
	return reg.Register(&horizonCollector{hr: hr})
}
