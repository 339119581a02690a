// Package rabbitmq publishes outbox messages to RabbitMQ (AMQP 0-9-1) with
// publisher confirms, through github.com/rabbitmq/amqp091-go.
//
//	p, err := rabbitmq.Dial(ctx, "amqp://guest:guest@localhost:5672/", rabbitmq.Options{})
//
// # Guarantees
//
//   - A nil result means the broker confirmed the message (basic.ack) and did
//     not return it: with the default persistent delivery mode and durable
//     queues, it is on disk (for quorum queues, on a majority of nodes).
//   - Unroutable is a failure. Messages are published with the mandatory
//     flag; a message no queue is bound for is returned by the broker
//     (basic.return, which the broker sends before its basic.ack) and
//     blocks its topic (outbox.Blocked: the relay pauses the topic, spends
//     no attempt and dead-letters nothing until a queue is bound), naming
//     the exchange and routing key. Returns are matched
//     to messages by message-id, and a message's result is only decided
//     after every return the broker sent before its confirm has been seen.
//   - One result per message, in a batch published pipelined on one
//     channel, in order; the relay never puts two messages of one key in a
//     batch, so per-key order holds across batches.
//   - Bounded: at most Options.MaxInFlight messages await a confirm across
//     all calls; a call ends when its context does (or after
//     Options.PublishTimeout without a deadline), abandoning the confirms it
//     still waits for with errors blocking their topics (retryable if the
//     context was cancelled rather than timed out).
//   - Recovery: when the connection drops (a broker restart), the messages
//     awaiting a confirm fail with errors blocking their topics (their
//     outcome is unknown: the relay spends no attempt) and the next Publish
//     dials again, with exponential backoff between failed attempts. The
//     relay retries; messages confirmed before the drop are not lost.
//
// # Topology
//
// The Publisher declares one durable topic exchange (Options.Exchange,
// "outbox" by default) and publishes each message with routing key
// Options.RoutingKey(topic), by default the topic itself. Binding queues to
// the exchange is the consumers' business: bind a queue with the topic (or
// a pattern such as "orders.#") before publishing to it, or publishing
// fails as unroutable. Classic and quorum queues both work; quorum queues
// (x-queue-type=quorum) are the durable choice.
package rabbitmq
