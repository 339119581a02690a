package kinesis

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"

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

	// MaxBatchRecordsMax is the most records Kinesis takes in one
	// PutRecords request.
	MaxBatchRecordsMax = 500
	// MaxBatchRecordsDefault is how many records go in one request.
	MaxBatchRecordsDefault = MaxBatchRecordsMax

	// MaxRecordBytesDefault is Kinesis's classic limit of a record, data
	// and partition key (1 MiB). Streams whose maximum record size was
	// raised (UpdateMaxRecordSize) take up to MaxRecordBytesMax.
	MaxRecordBytesDefault = 1 << 20
	// MaxRecordBytesMax is the largest MaxRecordBytes accepted (10 MiB).
	MaxRecordBytesMax = 10 << 20

	// MaxRequestBytes bounds the records of one PutRecords request
	// together, data and partition keys (Kinesis's 5 MiB); a record larger
	// than that (MaxRecordBytes above 5 MiB) goes alone.
	MaxRequestBytes = 5 << 20

	// MaxConcurrentRequestsDefault bounds the requests one Publish call has
	// in flight.
	MaxConcurrentRequestsDefault = 16
	// MaxConcurrentRequestsMax is the largest MaxConcurrentRequests
	// accepted.
	MaxConcurrentRequestsMax = 1024

	// maxStreamName is the longest stream name Kinesis accepts.
	maxStreamName = 128
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
	// Profile selects a profile of the shared configuration files (when
	// AWS is nil).
	Profile string
	// Endpoint overrides the Kinesis endpoint (http://127.0.0.1:4567 for a
	// local server, a VPC endpoint).
	Endpoint string

	// StreamMapper maps a message's Topic to its stream: a stream name or
	// a stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME). Default:
	// the topic itself ("orders.created" → stream "orders.created": Kinesis
	// names take letters, digits, '_', '-' and '.'). It is called
	// concurrently.
	StreamMapper func(topic string) string

	// MaxBatchRecords is how many records go in one PutRecords request
	// (default and at most MaxBatchRecordsMax).
	MaxBatchRecords int
	// MaxRecordBytes bounds a record, envelope, payload and partition key
	// (default MaxRecordBytesDefault, at most MaxRecordBytesMax); a
	// message whose record is over it fails permanently without being
	// sent.
	MaxRecordBytes int
	// MaxConcurrentRequests bounds the requests one Publish call has in
	// flight (default MaxConcurrentRequestsDefault).
	MaxConcurrentRequests int
	// PublishTimeout bounds a Publish call whose context has no deadline
	// (default PublishTimeoutDefault).
	PublishTimeout time.Duration

	// CloudEvents, if set, publishes every message as a CloudEvent
	// (cloudevents.Kinesis): in binary mode the event's attributes are
	// "ce-<name>" headers of the envelope and the payload is the data; in
	// structured mode the payload is the event as JSON and the envelope's
	// "Content-Type" header says so. The envelope stays, so the outbox ID,
	// key and other headers travel as without CloudEvents; consumers read
	// the event with Decode and cloudevents.Decode(cloudevents.Kinesis,
	// cloudevents.MapHeaders(m.Headers), "", m.Payload). Default: off.
	CloudEvents *cloudevents.Options

	// Logger receives the publisher's warnings. Default: discard.
	Logger *slog.Logger
	// ClientOptions are applied last to the SDK client's options.
	ClientOptions []func(*awskinesis.Options)
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.StreamMapper == nil {
		o.StreamMapper = func(topic string) string { return topic }
	}
	o.MaxBatchRecords = cmp.Or(o.MaxBatchRecords, MaxBatchRecordsDefault)
	o.MaxRecordBytes = cmp.Or(o.MaxRecordBytes, MaxRecordBytesDefault)
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
	c := optcheck.Check("kinesis")
	c.Between("MaxBatchRecords", o.MaxBatchRecords, 1, MaxBatchRecordsMax)
	c.Between("MaxRecordBytes", o.MaxRecordBytes, 1024, MaxRecordBytesMax)
	c.Between("MaxConcurrentRequests", o.MaxConcurrentRequests, 1, MaxConcurrentRequestsMax)
	c.AtLeast("PublishTimeout", o.PublishTimeout, PublishTimeoutMin)
	c.Failf(o.Endpoint != "" && !strings.HasPrefix(o.Endpoint, "http://") && !strings.HasPrefix(o.Endpoint, "https://"),
		"Endpoint %q must be a URL such as https://kinesis.eu-west-1.amazonaws.com or http://127.0.0.1:4567", o.Endpoint)
	if o.CloudEvents != nil {
		err := o.CloudEvents.WithDefaults().Validate()
		c.Failf(err != nil, "CloudEvents: %w", err)
	}
	return c.Err()
}

// isARN reports whether a StreamMapper result is a stream ARN.
func isARN(stream string) bool { return strings.HasPrefix(stream, "arn:") }

// validateStream checks a stream name (1 to 128 letters, digits, '_', '-'
// and '.') or the form of a stream ARN.
func validateStream(stream string) error {
	if isARN(stream) {
		if i := strings.Index(stream, ":stream/"); i < 0 || !strings.HasPrefix(stream, "arn:aws") || len(stream) > 2048 {
			return fmt.Errorf("%q is not a stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)", stream)
		}
		return optcheck.Name(stream[strings.Index(stream, ":stream/")+len(":stream/"):], maxStreamName, "_-.")
	}
	return optcheck.Name(stream, maxStreamName, "_-.")
}
