package backends

import (
	"context"
	"net/url"
	"strings"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sqs"
)

// Amazon SQS broker: sqs://[REGION][?param=value...], a queue per topic
// (named after the topic, dots turned into '-', prefix first; ".fifo"
// added with fifo=true) or one queue for all (queue=NAME or URL), such as
// sqs://eu-west-1?fifo=true.
//
// Credentials and region come from the AWS configuration chain (the
// environment, AWS_PROFILE or profile=, AWS_SHARED_CREDENTIALS_FILE, web
// identity, the container or instance role): secrets stay in files, never
// in the URL.
//
// Query parameters (see sqs.ParseURL): endpoint, profile, fifo, queue,
// batch_entries, max_message_bytes, max_concurrent_requests,
// publish_timeout, protocol (query for servers without SQS's JSON
// protocol, such as goaws); plus the outbox's own: prefix, max_in_flight
// (the concurrent requests), ack_timeout (the publish timeout).
func init() { RegisterBroker("sqs", openSQS) }

func openSQS(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	uo, err := sqs.ParseURL(u.String())
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
		return nil, Invalid(BrokerTLSFlag, "does not apply to SQS: the AWS SDK uses HTTPS with the system's CAs (give an https:// endpoint)")
	}
	prefix, fifo := o.SubjectPrefix, uo.FIFO
	switch {
	case uo.Queue != "":
		queue := uo.Queue
		opts.QueueMapper = func(string) string { return queue }
	case prefix != "":
		opts.QueueMapper = func(topic string) string {
			name := strings.ReplaceAll(prefix+topic, ".", "-")
			if fifo {
				name += ".fifo"
			}
			return name
		}
	}
	if uo.Query {
		opts.ClientOptions = append(opts.ClientOptions, func(c *awssqs.Options) { sqs.QueryProtocol(c) })
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	return sqs.Dial(ctx, opts)
}
