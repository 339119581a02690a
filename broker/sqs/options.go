package sqs

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Defaults and limits of [Options].
const (
	// PublishTimeoutDefault bounds a Publish call whose context has no
	// deadline.
	PublishTimeoutDefault = 10 * time.Second
	// PublishTimeoutMin is the smallest PublishTimeout accepted.
	PublishTimeoutMin = time.Millisecond

	// MaxBatchEntries is the most entries SQS takes in one SendMessageBatch.
	MaxBatchEntries = 10
	// BatchEntriesDefault is how many messages go in one request.
	BatchEntriesDefault = MaxBatchEntries

	// MaxMessageBytesDefault is SQS's classic limit of a message, body and
	// attributes (256 KiB), which is also the limit of a whole
	// SendMessageBatch request's messages. SQS has accepted 1 MiB since
	// 2025: raise MaxMessageBytes to MaxMessageBytesMax where the queues
	// allow it (MaximumMessageSize).
	MaxMessageBytesDefault = 256 << 10
	// MaxMessageBytesMax is the largest MaxMessageBytes accepted (1 MiB).
	MaxMessageBytesMax = 1 << 20

	// MaxConcurrentRequestsDefault bounds the requests one Publish call has
	// in flight.
	MaxConcurrentRequestsDefault = 16
	// MaxConcurrentRequestsMax is the largest MaxConcurrentRequests accepted.
	MaxConcurrentRequestsMax = 1024

	// MaxAttributes is the most message attributes SQS takes per message.
	MaxAttributes = awsmsg.MaxAttributes

	// queueCacheTTL is how long a queue URL found with GetQueueUrl is used
	// without asking again.
	queueCacheTTL = 5 * time.Minute
)

// Message attribute names the publisher sets (String attributes).
const (
	// AttrID carries Message.ID (also the MessageDeduplicationId of a FIFO
	// queue).
	AttrID = awsmsg.AttrID
	// AttrKey carries Message.Key (when not empty; also the
	// MessageGroupId of a FIFO queue, see GroupID).
	AttrKey = awsmsg.AttrKey
	// AttrCreatedAt carries Message.CreatedAt, RFC 3339 with nanoseconds,
	// UTC (when not zero).
	AttrCreatedAt = awsmsg.AttrCreatedAt
	// AttrEncoding is set when the body is not the payload as is:
	// "base64" (the payload is not text SQS accepts) or "empty" (an empty
	// payload; SQS needs a body of at least one character, so the body is
	// "-").
	AttrEncoding = awsmsg.AttrEncoding
	// AttrHeaders carries all the message's headers as one JSON object,
	// when they do not fit as attributes of their own (see Publisher).
	AttrHeaders = awsmsg.AttrHeaders
)

// Options configures a [Publisher]. Every field has a default; AWS
// credentials and region come from the AWS configuration chain unless
// given.
type Options struct {
	// AWS is the SDK configuration (credentials, region, HTTP client).
	// Default: config.LoadDefaultConfig with Region and Profile: the
	// environment (AWS_ACCESS_KEY_ID, AWS_REGION, …), the shared config
	// and credentials files, web identity, the container and instance
	// roles.
	AWS *aws.Config
	// Region overrides the configuration's region.
	Region string
	// Profile selects a profile of the shared configuration files (when AWS
	// is nil).
	Profile string
	// Endpoint overrides the SQS endpoint (http://127.0.0.1:4100 for a
	// local server, a VPC endpoint).
	Endpoint string

	// QueueMapper maps a message's Topic to its queue: a queue name
	// (resolved once with GetQueueUrl, and cached) or a queue URL
	// (https://…). Default: the topic with every '.' replaced by '-', plus
	// ".fifo" when FIFO is set ("orders.created" → "orders-created"). A
	// name ending in ".fifo" is a FIFO queue. It is called concurrently.
	QueueMapper func(topic string) string
	// FIFO makes the default QueueMapper add ".fifo" to queue names.
	FIFO bool

	// BatchEntries is how many messages go in one SendMessageBatch
	// request (default and at most MaxBatchEntries). 1 sends each with
	// SendMessage.
	BatchEntries int
	// MaxMessageBytes bounds a message, body and attributes (default
	// MaxMessageBytesDefault, at most MaxMessageBytesMax); a message over
	// it fails permanently without being sent. It also bounds the
	// messages of one batch request together.
	MaxMessageBytes int
	// MaxConcurrentRequests bounds the requests one Publish call has in
	// flight (default MaxConcurrentRequestsDefault).
	MaxConcurrentRequests int
	// PublishTimeout bounds a Publish call whose context has no deadline
	// (default PublishTimeoutDefault).
	PublishTimeout time.Duration

	// CloudEvents, if set, publishes every message as a CloudEvent
	// (cloudevents.SQS): in binary mode the event's attributes are
	// "ce-<name>" headers and the body is the data; in structured mode the
	// body is the event as JSON and the header "Content-Type" says so. The
	// headers travel as message attributes as always: with the binary
	// mode's attributes they are usually more than fit, so all of them go
	// packed in Outbox-Headers (see Publisher). Consumers read them with
	// cloudevents.MapHeaders and cloudevents.Decode(cloudevents.SQS, …).
	// Default: off.
	CloudEvents *cloudevents.Options

	// Logger receives the publisher's warnings. Default: discard.
	Logger *slog.Logger
	// ClientOptions are applied last to the SDK client's options (such as
	// the query protocol for servers without the JSON one: see
	// QueryProtocol).
	ClientOptions []func(*awssqs.Options)
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.QueueMapper == nil {
		fifo := o.FIFO
		o.QueueMapper = func(topic string) string {
			name := strings.ReplaceAll(topic, ".", "-")
			if fifo {
				name += ".fifo"
			}
			return name
		}
	}
	o.BatchEntries = cmp.Or(o.BatchEntries, BatchEntriesDefault)
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, MaxMessageBytesDefault)
	o.MaxConcurrentRequests = cmp.Or(o.MaxConcurrentRequests, MaxConcurrentRequestsDefault)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, PublishTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports whether o, with its defaults, is usable: the error Dial
// would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}

func (o Options) validate() error {
	c := optcheck.Check("sqs")
	c.Between("BatchEntries", o.BatchEntries, 1, MaxBatchEntries)
	c.Between("MaxMessageBytes", o.MaxMessageBytes, 1024, MaxMessageBytesMax)
	c.Between("MaxConcurrentRequests", o.MaxConcurrentRequests, 1, MaxConcurrentRequestsMax)
	c.AtLeast("PublishTimeout", o.PublishTimeout, PublishTimeoutMin)
	c.Failf(o.Endpoint != "" && !strings.HasPrefix(o.Endpoint, "http://") && !strings.HasPrefix(o.Endpoint, "https://"),
		"Endpoint %q must be a URL such as https://sqs.eu-west-1.amazonaws.com or http://127.0.0.1:4100", o.Endpoint)
	if o.CloudEvents != nil {
		err := o.CloudEvents.WithDefaults().Validate()
		c.Failf(err != nil, "CloudEvents: %w", err)
	}
	return c.Err()
}

// validateQueueName checks an SQS queue name: 1 to 80 letters, digits, '-'
// and '_', with ".fifo" at the end of a FIFO queue's.
func validateQueueName(name string) error {
	base := strings.TrimSuffix(name, ".fifo")
	if len(name) > 80 {
		return fmt.Errorf("%q is %d bytes; SQS allows 80", name, len(name))
	}
	return optcheck.Name(base, 80, "-_")
}
