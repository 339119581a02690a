package inbox

import "context"

// Tracer traces the handling of consumed messages: package tracing/otel
// implements it with OpenTelemetry consumer spans that continue the trace
// of the message's producer. The broker helpers of package consume call it
// when their Tracer field is set; nil traces nothing and costs nothing.
//
// StartHandle is called when a message arrives, before anything else. It
// returns the context to handle it with (the inbox transaction and the
// handler run with it, so their spans are children of the tracer's span)
// and a function called once with the outcome: processed as Handle
// returns it, and the error Handle returns. Both are called concurrently
// and must not block.
type Tracer interface {
	StartHandle(ctx context.Context, d Delivery) (context.Context, func(processed bool, err error))
}

// Delivery describes a consumed message to a [Tracer].
type Delivery struct {
	// System names the broker: "nats", "rabbitmq" or "kafka".
	System string
	// Destination is where the message was consumed from: the NATS
	// subject, the AMQP routing key, the Kafka topic.
	Destination string
	// Consumer is the consumer's name in the inbox records.
	Consumer string
	// MessageID is the outbox message ID, "" when the message has none.
	MessageID string
	// Headers reads the message's headers.
	Headers HeaderReader
}

// HeaderReader reads a consumed message's headers.
type HeaderReader interface {
	// Get returns the value of the header key, "" when it is absent.
	Get(key string) string
	// Keys returns the names of the headers.
	Keys() []string
}
