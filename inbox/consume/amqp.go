package consume

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/inbox"
)

// AMQPMessageID returns the message ID of a RabbitMQ delivery: its
// message-id property (set by the outbox RabbitMQ publisher), else its
// Outbox-Id header if that is a string, else the id of the CloudEvent it
// carries (binary or structured mode), else "".
func AMQPMessageID(d *amqp.Delivery) string {
	if d.MessageId != "" {
		return d.MessageId
	}
	if s, ok := d.Headers[outbox.HeaderID].(string); ok && s != "" {
		return s
	}
	return eventID(cloudevents.AMQP, amqpHeaders(d.Headers), d.ContentType, d.Body)
}

// AMQP handles RabbitMQ deliveries exactly once per ID through an inbox.
// The consumer must use manual acknowledgements (autoAck false).
type AMQP[Tx any] struct {
	// Runner is the inbox. Required.
	Runner inbox.Runner[Tx]
	// Consumer names this consumer in the inbox records, usually the queue
	// name. Required.
	Consumer string
	// Handler applies a delivery's effect inside tx. Required.
	Handler func(ctx context.Context, tx Tx, d *amqp.Delivery) error
	// DeadLetterOnError rejects a failed delivery without requeueing it (to
	// the queue's dead-letter exchange, if any) instead of the default,
	// requeueing it for another attempt.
	DeadLetterOnError bool
	// Tracer, if set, traces each message (see inbox.Tracer): with
	// outboxtrace.NewHandleTracer (package tracing/otel) the inbox
	// transaction and the handler run in a consumer span, a child of the
	// span that published the message. Default none.
	Tracer inbox.Tracer
}

// Handle handles one delivery (see the package documentation for the
// outcomes). It acknowledges, nacks or rejects d itself.
func (h *AMQP[Tx]) Handle(ctx context.Context, d *amqp.Delivery) (processed bool, err error) {
	if err := check("AMQP", h.Consumer, h.Runner != nil, h.Handler != nil); err != nil {
		return false, err
	}
	id := AMQPMessageID(d)
	ctx, end := startHandle(ctx, h.Tracer, inbox.Delivery{System: "rabbitmq", Destination: d.RoutingKey, Consumer: h.Consumer, MessageID: id, Headers: amqpHeaders(d.Headers)})
	defer func() { end(processed, err) }()
	if id == "" {
		return false, noID(fmt.Sprintf("AMQP delivery %d from exchange %q, routing key %q (no message-id, no %s header)", d.DeliveryTag, d.Exchange, d.RoutingKey, outbox.HeaderID), d.Reject(false))
	}
	processed, err = h.Runner.Run(ctx, h.Consumer, id, func(ctx context.Context, tx Tx) error {
		return h.Handler(ctx, tx, d)
	})
	if err != nil {
		if nackErr := d.Nack(false, !h.DeadLetterOnError); nackErr != nil {
			err = errors.Join(err, fmt.Errorf("consume: nack: %w", nackErr))
		}
		return false, err
	}
	if err := d.Ack(false); err != nil {
		return processed, fmt.Errorf("consume: ack message %q after commit (a redelivery will be dropped): %w", id, err)
	}
	return processed, nil
}
