package consume

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/inbox"
)

// KafkaMessageID returns the value of a record's Outbox-Id header (set by
// the outbox Kafka publisher), else the id of the CloudEvent it carries
// (binary or structured mode), else "".
func KafkaMessageID(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == outbox.HeaderID {
			return string(h.Value)
		}
	}
	return eventID(cloudevents.Kafka, kafkaHeaders(rec.Headers), "", rec.Value)
}

// Marker marks records for the next offset commit; *kgo.Client implements
// it (with the kgo.AutoCommitMarks group option).
type Marker interface {
	MarkCommitRecords(rs ...*kgo.Record)
}

// Kafka handles Kafka records exactly once per ID through an inbox.
//
// Kafka has no per-record negative acknowledgement: a record whose handling
// failed is left unmarked, and the caller must not go on with later records
// of its partition (marking a later record commits past it). Retry the
// record, or stop and let the group resume from the last committed offset;
// either way a record that did commit is dropped as a duplicate.
type Kafka[Tx any] struct {
	// Runner is the inbox. Required.
	Runner inbox.Runner[Tx]
	// Consumer names this consumer in the inbox records, usually the
	// consumer group. Required.
	Consumer string
	// Handler applies a record's effect inside tx. Required.
	Handler func(ctx context.Context, tx Tx, rec *kgo.Record) error
	// Marker marks handled records for commit: the *kgo.Client, created
	// with kgo.AutoCommitMarks. Required.
	Marker Marker
	// Tracer, if set, traces each message (see inbox.Tracer): with
	// outboxtrace.NewHandleTracer (package tracing/otel) the inbox
	// transaction and the handler run in a consumer span, a child of the
	// span that published the message. Default none.
	Tracer inbox.Tracer
}

// Handle handles one record (see the package documentation for the
// outcomes). It marks rec for commit only after its transaction committed
// (or when it is a duplicate, or carries no ID and is skipped).
func (h *Kafka[Tx]) Handle(ctx context.Context, rec *kgo.Record) (processed bool, err error) {
	if err := check("Kafka", h.Consumer, h.Runner != nil, h.Handler != nil); err != nil {
		return false, err
	}
	if h.Marker == nil {
		return false, fmt.Errorf("consume: Kafka.Marker is nil: set it to the *kgo.Client (with kgo.AutoCommitMarks)")
	}
	id := KafkaMessageID(rec)
	ctx, end := startHandle(ctx, h.Tracer, inbox.Delivery{System: "kafka", Destination: rec.Topic, Consumer: h.Consumer, MessageID: id, Headers: kafkaHeaders(rec.Headers)})
	defer func() { end(processed, err) }()
	if id == "" {
		h.Marker.MarkCommitRecords(rec)
		return false, noID(fmt.Sprintf("Kafka record %s/%d@%d (no %s header)", rec.Topic, rec.Partition, rec.Offset, outbox.HeaderID), nil)
	}
	processed, err = h.Runner.Run(ctx, h.Consumer, id, func(ctx context.Context, tx Tx) error {
		return h.Handler(ctx, tx, rec)
	})
	if err != nil {
		return false, err
	}
	h.Marker.MarkCommitRecords(rec)
	return processed, nil
}
