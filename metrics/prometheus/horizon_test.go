package outboxprom_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

type fakeHorizon struct {
	hz    *outbox.XminHorizon
	err   error
	reads atomic.Int64
}

func (f *fakeHorizon) XminHorizon(context.Context) (*outbox.XminHorizon, error) {
	f.reads.Add(1)
	return f.hz, f.err
}

func TestRegisterHorizonPerKind(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fakeHorizon{hz: &outbox.XminHorizon{AgeXids: 500, Holders: []outbox.HorizonHolder{
		{Kind: outbox.HolderSession, PID: 7, AgeXids: 500, AgeSeconds: new(120.5)},
		{Kind: outbox.HolderSlotCatalog, Name: "debezium", AgeXids: 400, AgeSeconds: new(30.0)},
		{Kind: outbox.HolderSession, PID: 8, AgeXids: 3, AgeSeconds: new(0.2)},
	}}}
	if err := outboxprom.RegisterHorizon(reg, f); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP outbox_postgres_xmin_horizon_age_xids Age in transaction IDs of the oldest holder of each kind of the database's xmin horizon (capture table). 0 when none.
# TYPE outbox_postgres_xmin_horizon_age_xids gauge
outbox_postgres_xmin_horizon_age_xids{holder="prepared"} 0
outbox_postgres_xmin_horizon_age_xids{holder="session"} 500
outbox_postgres_xmin_horizon_age_xids{holder="slot"} 0
outbox_postgres_xmin_horizon_age_xids{holder="slot_catalog"} 400
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_postgres_xmin_horizon_age_xids"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "outbox_postgres_xmin_horizon_age_seconds" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	// Read a moment ago: the ages in seconds are at least the read's.
	if got["session"] < 120.5 || got["session"] > 121.5 || got["slot_catalog"] < 30 || got["prepared"] != 0 || got["slot"] != 0 {
		t.Errorf("age seconds %v", got)
	}

	// A failing read is a scrape error, not a zero (a fresh collector: the
	// first one's reading is still recent).
	f.err = errors.New("connection refused")
	reg = prometheus.NewRegistry()
	if err := outboxprom.RegisterHorizon(reg, f); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Gather with a failing store: %v", err)
	}
	if err := outboxprom.RegisterHorizon(nil, f); err == nil {
		t.Error("RegisterHorizon(nil, …) succeeded")
	}
}

// TestHorizonReadAtMostEveryInterval: scrapes closer together than the
// read interval share one reading (a scraper polling every 100 ms must not
// query the catalogue each time); once it has passed, the next scrape
// reads again; a failed read is not kept.
func TestHorizonReadAtMostEveryInterval(t *testing.T) {
	defer outboxprom.SetHorizonReadEvery(time.Hour)()
	f := &fakeHorizon{hz: &outbox.XminHorizon{Holders: []outbox.HorizonHolder{{Kind: outbox.HolderSession, AgeXids: 9, AgeSeconds: new(60.0)}}}}
	reg := prometheus.NewRegistry()
	if err := outboxprom.RegisterHorizon(reg, f); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.reads.Load(); n != 1 {
		t.Fatalf("10 scrapes within the interval read the horizon %d times, want 1", n)
	}
	outboxprom.SetHorizonReadEvery(0)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := f.reads.Load(); n != 2 {
		t.Fatalf("a scrape after the interval: %d reads, want 2", n)
	}
	f.err = errors.New("connection refused")
	outboxprom.SetHorizonReadEvery(0)
	if _, err := reg.Gather(); err == nil {
		t.Fatal("a failing read was not a scrape error")
	}
	f.err = nil
	outboxprom.SetHorizonReadEvery(time.Hour)
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("the scrape after a failed read: %v (a failure must not be kept)", err)
	}
	if n := f.reads.Load(); n != 4 {
		t.Fatalf("%d reads, want 4: the scrape after a failure reads again", n)
	}
}
