package outboxprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

var (
	requestsDesc = prometheus.NewDesc("outbox_store_requests_total",
		"Requests the store sent, per operation (stores that count them: DynamoDB).", []string{"operation"}, nil)
	requestErrorsDesc = prometheus.NewDesc("outbox_store_request_errors_total",
		"Store requests that failed, per operation.", []string{"operation"}, nil)
	capacityDesc = prometheus.NewDesc("outbox_store_consumed_capacity_total",
		"Capacity units the store reported consumed, per operation.", []string{"operation"}, nil)
)

// requestCollector reads a store's request counts at scrape time.
type requestCollector struct{ rc outbox.RequestCounter }

func (c requestCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- requestsDesc
	ch <- requestErrorsDesc
	ch <- capacityDesc
}

func (c requestCollector) Collect(ch chan<- prometheus.Metric) {
	for op, s := range c.rc.RequestStats() {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(s.Requests), op)
		ch <- prometheus.MustNewConstMetric(requestErrorsDesc, prometheus.CounterValue, float64(s.Errors), op)
		ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.CounterValue, s.ConsumedCapacity, op)
	}
}

// RegisterRequests exports the request counts of a store that keeps them
// (outbox.RequestCounter, such as the DynamoDB store) with reg, read at
// every scrape: outbox_store_requests_total, _request_errors_total and
// _consumed_capacity_total, labelled by operation.
func RegisterRequests(reg prometheus.Registerer, rc outbox.RequestCounter) error {
	if reg == nil || rc == nil {
		return errors.New("outboxprom: RegisterRequests needs a registerer and a store")
	}
	return reg.Register(requestCollector{rc})
}
