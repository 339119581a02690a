package consume

import (
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox/cloudevents"
)

// CloudEvents: a message the publishers sent with Options.CloudEvents
// still carries the outbox's own ID headers, so the helpers deduplicate it
// as any other. A CloudEvent from another producer (binary or structured
// mode) has its id read as the message ID when those headers are absent;
// the trace context of a binary-mode event's Distributed Tracing extension
// (ce-traceparent, ce_traceparent, cloudEvents:traceparent) reaches the
// Tracer when the plain traceparent header is absent. Handlers read the
// event itself with NATSEvent, AMQPEvent or KafkaEvent.

// NATSEvent returns the CloudEvent a JetStream message carries, in binary
// or structured mode (an error wrapping cloudevents.ErrNotCloudEvent when
// it carries none).
func NATSEvent(msg jetstream.Msg) (*cloudevents.Event, error) {
	return cloudevents.Decode(cloudevents.NATS, natsHeaders(msg.Headers()), "", msg.Data())
}

// AMQPEvent returns the CloudEvent a RabbitMQ delivery carries, in binary
// or structured mode.
func AMQPEvent(d *amqp.Delivery) (*cloudevents.Event, error) {
	return cloudevents.Decode(cloudevents.AMQP, amqpHeaders(d.Headers), d.ContentType, d.Body)
}

// KafkaEvent returns the CloudEvent a Kafka record carries, in binary or
// structured mode.
func KafkaEvent(rec *kgo.Record) (*cloudevents.Event, error) {
	return cloudevents.Decode(cloudevents.Kafka, kafkaHeaders(rec.Headers), "", rec.Value)
}

// eventID returns the id of the CloudEvent a message carries, "" when it
// carries none.
func eventID(b cloudevents.Binding, h cloudevents.Headers, contentType string, body []byte) string {
	ev, err := cloudevents.Decode(b, h, contentType, body)
	if err != nil {
		return ""
	}
	return ev.ID
}

// traceFallback returns the CloudEvents Distributed Tracing extension's
// header for a trace context header key absent from a message: the
// binding's prefixed name ("" for other keys).
func traceFallback(get func(string) string, key string, prefixes ...string) string {
	if key != "traceparent" && key != "tracestate" {
		return ""
	}
	for _, p := range prefixes {
		if v := get(p + key); v != "" {
			return v
		}
	}
	return ""
}
