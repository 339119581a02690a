package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/inbox"
)

// NATSMessageID returns the message ID of a JetStream message: its
// Nats-Msg-Id header (set by the outbox NATS publisher, and used by
// JetStream's own duplicate window), else its Outbox-Id header, else the
// id of the CloudEvent it carries (binary or structured mode), else "".
func NATSMessageID(msg jetstream.Msg) string {
	h := msg.Headers()
	if id := h.Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	if id := h.Get(outbox.HeaderID); id != "" {
		return id
	}
	return eventID(cloudevents.NATS, natsHeaders(h), "", msg.Data())
}

// NATS handles JetStream messages exactly once per ID through an inbox. The
// consumer must use explicit acks (jetstream.AckExplicitPolicy, the default).
type NATS[Tx any] struct {
	// Runner is the inbox (for example *postgres.Inbox, *sqlite.Inbox).
	// Required.
	Runner inbox.Runner[Tx]
	// Consumer names this consumer in the inbox records, usually the durable
	// consumer's name. Required.
	Consumer string
	// Handler applies a message's effect inside tx. Required.
	Handler func(ctx context.Context, tx Tx, msg jetstream.Msg) error
	// NakDelay, if positive, asks JetStream to redeliver a failed message
	// after this delay (NakWithDelay); zero naks for immediate redelivery.
	NakDelay time.Duration
	// Tracer, if set, traces each message (see inbox.Tracer): with
	// outboxtrace.NewHandleTracer (package tracing/otel) the inbox
	// transaction and the handler run in a consumer span, a child of the
	// span that published the message. Default none.
	Tracer inbox.Tracer
}

// Handle handles one message (see the package documentation for the
// outcomes). It acknowledges or naks msg itself. ctx bounds the transaction.
func (h *NATS[Tx]) Handle(ctx context.Context, msg jetstream.Msg) (processed bool, err error) {
	if err := check("NATS", h.Consumer, h.Runner != nil, h.Handler != nil); err != nil {
		return false, err
	}
	id := NATSMessageID(msg)
	ctx, end := startHandle(ctx, h.Tracer, inbox.Delivery{System: "nats", Destination: msg.Subject(), Consumer: h.Consumer, MessageID: id, Headers: natsHeaders(msg.Headers())})
	defer func() { end(processed, err) }()
	if id == "" {
		return false, noID(fmt.Sprintf("NATS message on %q (no %s or %s header)", msg.Subject(), jetstream.MsgIDHeader, outbox.HeaderID), msg.Term())
	}
	processed, err = h.Runner.Run(ctx, h.Consumer, id, func(ctx context.Context, tx Tx) error {
		return h.Handler(ctx, tx, msg)
	})
	if err != nil {
		var nakErr error
		if h.NakDelay > 0 {
			nakErr = msg.NakWithDelay(h.NakDelay)
		} else {
			nakErr = msg.Nak()
		}
		if nakErr != nil {
			err = errors.Join(err, fmt.Errorf("consume: nak: %w", nakErr))
		}
		return false, err
	}
	// Committed (or a duplicate of a committed message): only now ack.
	if err := msg.Ack(); err != nil {
		return processed, fmt.Errorf("consume: ack message %q after commit (a redelivery will be dropped): %w", id, err)
	}
	return processed, nil
}

// MessageHandler returns a jetstream.MessageHandler for Consumer.Consume that
// calls Handle with ctx and passes every error to onError (which may be nil).
func (h *NATS[Tx]) MessageHandler(ctx context.Context, onError func(error)) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		if _, err := h.Handle(ctx, msg); err != nil && onError != nil {
			onError(err)
		}
	}
}
