package outboxprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

type fakeCounter map[string]outbox.RequestStats

func (f fakeCounter) RequestStats() map[string]outbox.RequestStats { return f }

func TestRegisterRequestsExportsPerOperation(t *testing.T) {
	reg := prometheus.NewRegistry()
	rc := fakeCounter{"Query": {Requests: 7, Errors: 1, ConsumedCapacity: 3.5}, "BatchWriteItem": {Requests: 2}}
	if err := outboxprom.RegisterRequests(reg, rc); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP outbox_store_requests_total Requests the store sent, per operation (stores that count them: DynamoDB).
# TYPE outbox_store_requests_total counter
outbox_store_requests_total{operation="BatchWriteItem"} 2
outbox_store_requests_total{operation="Query"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_store_requests_total"); err != nil {
		t.Fatal(err)
	}
	rc["Query"] = outbox.RequestStats{Requests: 9, Errors: 1, ConsumedCapacity: 4}
	if got := testutil.ToFloat64(collectorFor(t, reg, "outbox_store_consumed_capacity_total", "Query")); got != 4 {
		t.Fatalf("consumed capacity for Query = %v, want 4 (read at scrape time)", got)
	}
	if err := outboxprom.RegisterRequests(nil, rc); err == nil {
		t.Fatal("RegisterRequests(nil, …) succeeded")
	}
}

// collectorFor gathers reg and returns the value of one series as a gauge
// for testutil.
func collectorFor(t *testing.T, reg *prometheus.Registry, name, op string) prometheus.Gauge {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == op {
					g.Set(m.GetCounter().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no %s{operation=%q}", name, op)
	return nil
}
