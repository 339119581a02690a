package backends

import (
	"context"
	"net/url"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kinesis"
)

// Amazon Kinesis Data Streams broker: kinesis://[REGION][?param=value...],
// a stream per topic (named after the topic, prefix first) or one stream
// for all (stream=NAME or ARN), such as kinesis://eu-west-1?stream=orders.
// The partition key is the message key; the record's data is an envelope
// (see broker/kinesis).
//
// Credentials and region come from the AWS configuration chain (the
// environment, AWS_PROFILE or profile=, AWS_SHARED_CREDENTIALS_FILE, web
// identity, the container or instance role): secrets stay in files, never
// in the URL.
//
// Query parameters (see kinesis.ParseURL): region, endpoint, profile,
// stream, max_batch_records, max_record_bytes, max_concurrent_requests,
// publish_timeout; plus the outbox's own: prefix, max_in_flight (the
// concurrent requests), ack_timeout (the publish timeout).
func init() { RegisterBroker("kinesis", openKinesis) }

func openKinesis(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	uo, err := kinesis.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	opts := uo.Options
	if o.MaxInFlight != 0 {
		opts.MaxConcurrentRequests = o.MaxInFlight
	}
	if o.AckTimeout != 0 {
		opts.PublishTimeout = o.AckTimeout
	}
	if o.TLS.enabled() {
		return nil, Invalid(BrokerTLSFlag, "does not apply to Kinesis: the AWS SDK uses HTTPS with the system's CAs (give an https:// endpoint)")
	}
	switch prefix := o.SubjectPrefix; {
	case uo.Stream != "":
		stream := uo.Stream
		opts.StreamMapper = func(string) string { return stream }
	case prefix != "":
		opts.StreamMapper = func(topic string) string { return prefix + topic }
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	return kinesis.Dial(ctx, opts)
}
