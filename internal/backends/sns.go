package backends

import (
	"context"
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sns"
)

// Amazon SNS broker: sns://[REGION]?account=123456789012[&fifo=true], an
// SNS topic per outbox topic (dots turned into '-', prefix first; ".fifo"
// added with fifo=true) or one for all (topic=NAME or ARN). Credentials and
// region come from the AWS configuration chain, as for sqs://.
//
// Query parameters (see sns.ParseURL): endpoint, profile, account,
// partition, fifo, topic, batch_entries, max_message_bytes,
// max_concurrent_requests, publish_timeout; plus the outbox's own: prefix,
// max_in_flight (the concurrent requests), ack_timeout.
func init() { RegisterBroker("sns", openSNS) }

func openSNS(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	uo, err := sns.ParseURL(u.String())
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
		return nil, Invalid(BrokerTLSFlag, "does not apply to SNS: the AWS SDK uses HTTPS with the system's CAs (give an https:// endpoint)")
	}
	prefix, fifo := o.SubjectPrefix, uo.FIFO
	switch {
	case uo.Topic != "":
		topic := uo.Topic
		opts.TopicMapper = func(string) string { return topic }
	case prefix != "":
		opts.TopicMapper = func(topic string) string {
			name := strings.ReplaceAll(prefix+topic, ".", "-")
			if fifo {
				name += ".fifo"
			}
			return name
		}
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	return sns.Dial(ctx, opts)
}
