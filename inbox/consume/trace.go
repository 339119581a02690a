package consume

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/inbox"
)

// startHandle starts tracing one message when t is set; end is never nil.
func startHandle(ctx context.Context, t inbox.Tracer, d inbox.Delivery) (context.Context, func(bool, error)) {
	if t == nil {
		return ctx, func(bool, error) {}
	}
	tctx, end := t.StartHandle(ctx, d)
	if tctx == nil {
		tctx = ctx
	}
	if end == nil {
		end = func(bool, error) {}
	}
	return tctx, end
}

// natsHeaders reads a NATS message's headers (first value of each).
type natsHeaders nats.Header

func (h natsHeaders) Get(key string) string {
	if v := nats.Header(h).Get(key); v != "" {
		return v
	}
	return traceFallback(nats.Header(h).Get, key, cloudevents.NATS.Prefix)
}
func (h natsHeaders) Keys() []string { return keys(h) }

// amqpHeaders reads the string (or byte slice) values of an AMQP headers
// table.
type amqpHeaders amqp.Table

func (h amqpHeaders) Get(key string) string {
	if v := h.get(key); v != "" {
		return v
	}
	return traceFallback(h.get, key, cloudevents.AMQP.Prefix, "cloudEvents_")
}

func (h amqpHeaders) get(key string) string {
	switch v := h[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}
func (h amqpHeaders) Keys() []string { return keys(h) }

// kafkaHeaders reads a Kafka record's headers (the first of each key).
type kafkaHeaders []kgo.RecordHeader

func (h kafkaHeaders) Get(key string) string {
	if v := h.get(key); v != "" {
		return v
	}
	return traceFallback(h.get, key, cloudevents.Kafka.Prefix)
}

func (h kafkaHeaders) get(key string) string {
	for _, rh := range h {
		if rh.Key == key {
			return string(rh.Value)
		}
	}
	return ""
}

func (h kafkaHeaders) Keys() []string {
	out := make([]string, len(h))
	for i, rh := range h {
		out[i] = rh.Key
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
