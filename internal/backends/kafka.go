package backends

import (
	"context"
	"net/url"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
)

// Kafka broker: kafka://host:port,host:port (the seed brokers; port 9092
// when omitted), producing idempotently with acks=all, the message key as
// record key, such as kafka://127.0.0.1:9092,127.0.0.1:9093?auto_create=true.
//
// Query parameters (see kafka.ParseURL): auto_create (let the broker create
// missing topics; by default a missing topic fails permanently),
// delivery_timeout, max_buffered_records, max_message_bytes, linger,
// client_id; plus the outbox's own: prefix (put before every topic),
// max_in_flight (the client's buffered-records bound), ack_timeout (the
// publish timeout).
func init() { RegisterBroker("kafka", openKafka) }

func openKafka(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	opts, err := kafka.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if o.MaxInFlight != 0 {
		if opts.MaxBufferedRecords != 0 && opts.MaxBufferedRecords != o.MaxInFlight {
			return nil, Invalid(BrokerFlag, "max_buffered_records=%d conflicts with max in flight %d; give one of them", opts.MaxBufferedRecords, o.MaxInFlight)
		}
		opts.MaxBufferedRecords = o.MaxInFlight
	}
	if o.AckTimeout != 0 {
		opts.PublishTimeout = o.AckTimeout
	}
	if prefix := o.SubjectPrefix; prefix != "" {
		opts.TopicMapper = func(topic string) string { return prefix + topic }
	}
	opts.Logger = o.Logger
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	return kafka.Dial(ctx, opts)
}
