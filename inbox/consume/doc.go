// Package consume connects broker consumers to an inbox: for each message it
// reads the outbox message ID, runs the handler through an [inbox.Runner]
// (begin a transaction, record the ID, run the handler if the ID is new,
// commit) and acknowledges the message only after the commit.
//
//   - [NATS] for JetStream (jetstream.Msg): the ID is the Nats-Msg-Id header,
//     else the Outbox-Id header.
//   - [AMQP] for RabbitMQ (amqp091 Delivery): the ID is the AMQP message-id
//     property, else the Outbox-Id header. The consumer must not use
//     auto-ack.
//   - [Kafka] for franz-go (kgo.Record): the ID is the Outbox-Id header. The
//     client must use kgo.AutoCommitMarks (or commit marked offsets itself):
//     a record is marked for commit only after its transaction committed.
//
// Outcomes, for every broker:
//
//   - new message, handler succeeded, committed: acknowledged; Handle
//     returns (true, nil), or (true, err) if the acknowledgement failed (the
//     redelivery that may follow is dropped);
//   - duplicate (the ID was recorded by a committed transaction): the handler
//     is not called, the message is acknowledged; (false, nil);
//   - handler, record or commit error: the transaction rolls back and the
//     message is negatively acknowledged for redelivery (NATS Nak, AMQP Nack
//     with requeue, Kafka: not marked); (false, err);
//   - no message ID: the message cannot be deduplicated, so it is not handled
//     and is terminated (NATS Term, AMQP Reject without requeue so that a
//     dead-letter exchange receives it, Kafka: marked, i.e. skipped);
//     (false, err) with err wrapping inbox.ErrNoMessageID.
//
// The types are safe for concurrent use if their Runner is; they hold no
// state besides their configuration and never retry (the broker redelivers).
package consume

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outbox/inbox"
)

// check validates the fields every helper needs.
func check(helper, consumer string, hasRunner, hasHandler bool) error {
	if !hasRunner {
		return fmt.Errorf("consume: %s.Runner is nil: set it to an inbox (postgres.New, sqlite.New)", helper)
	}
	if !hasHandler {
		return fmt.Errorf("consume: %s.Handler is nil", helper)
	}
	if consumer == "" {
		return fmt.Errorf("consume: %s.Consumer is empty: name the consumer (durable, queue or group name)", helper)
	}
	return nil
}

// noID returns the error for a message without an ID, joined with the error
// of terminating it.
func noID(what string, termErr error) error {
	err := fmt.Errorf("%w: %s carries no message ID; it was not handled and was terminated", inbox.ErrNoMessageID, what)
	if termErr != nil {
		return errors.Join(err, fmt.Errorf("consume: terminate: %w", termErr))
	}
	return err
}
