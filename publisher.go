package outbox

import "context"

// Publisher sends messages to a broker.
//
// Publish sends every message of msgs and returns only after the broker has
// acknowledged or refused each one, or ctx ends. It returns a slice with
// one error per message: nil means the broker acknowledged (persisted) that
// message; an error wrapping [ErrDuplicate] means the broker acknowledged it
// as a duplicate of one it had stored. A publisher never retries by itself;
// it classifies errors: [Permanent] when the message itself can never be
// published, [Blocked] (with the message's Topic as destination) when the
// destination or the broker is unusable or the outcome is unknown, plain
// (retryable) otherwise. The brokertest package checks a publisher's
// classification against its broker. It carries
// Message.ID to the broker (NATS Nats-Msg-Id, AMQP message-id, a Kafka
// header) and the key (Kafka record key, a header elsewhere).
//
// The relay never passes two messages with the same non-empty Key in one
// call, nor a message whose key has an earlier message not yet
// acknowledged, so a publisher may send a batch fully pipelined; a
// publisher that implements [KeyPipeliner] may be passed several messages
// of one key in one call (see there).
//
// Publish may be called concurrently; messages are not retained after it
// returns.
type Publisher interface {
	Publish(ctx context.Context, msgs []*Message) []error
	Close() error
}

// KeyPipeliner is implemented by publishers whose broker keeps the order
// of one key's messages to one topic within a Publish call (Kafka's
// idempotent producer: one partition per key, sequence numbers per
// partition). The relay, decided once in NewRelay, then passes up to
// KeyPipeline() consecutive messages of a key in one call (all to the same
// Topic, in commit order, next to each other in msgs) instead of one, so
// that a key with a backlog has more than one message in flight. A result
// of 1 or less, or Config.OnPermanent = hold, keeps one message per key.
//
// The publisher promises, for the messages of one key and topic in one
// call: a message is written by the broker only after every earlier one of
// them was (its results are a run of acknowledgements and then failures; a
// failure whose outcome is unknown may still be written later, but only
// in order). Whatever the publisher reports, the relay never settles a
// message as delivered after an earlier message of its key in the call
// failed: the later ones go back behind the failed one, unsettled, and are
// published again after it (duplicates, never a reorder).
type KeyPipeliner interface {
	KeyPipeline() int
}

// Header names the publishers use to carry outbox fields.
const (
	// HeaderID carries Message.ID where the broker has no native field
	// (Kafka); NATS uses Nats-Msg-Id and AMQP message-id as well.
	HeaderID = "Outbox-Id"
	// HeaderKey carries Message.Key where the broker has no record key.
	HeaderKey = "Outbox-Key"
	// HeaderCreatedAt carries Message.CreatedAt as RFC 3339 with nanoseconds.
	HeaderCreatedAt = "Outbox-Created-At"
)

// FillErrors returns a slice of n errors all set to err: a whole-batch failure.
func FillErrors(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}
