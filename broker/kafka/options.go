package kafka

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Defaults and limits of [Options].
const (
	// DeliveryTimeoutDefault bounds how long a record may wait in the
	// client, including the client's own retries, before it fails
	// (kgo.RecordDeliveryTimeout, Kafka's delivery.timeout.ms).
	DeliveryTimeoutDefault = 30 * time.Second
	// DeliveryTimeoutMin is the smallest DeliveryTimeout accepted.
	DeliveryTimeoutMin = 100 * time.Millisecond

	// PublishTimeoutDefault bounds a Publish call whose context has no
	// deadline.
	PublishTimeoutDefault = 10 * time.Second
	// PublishTimeoutMin is the smallest PublishTimeout accepted.
	PublishTimeoutMin = time.Millisecond

	// MaxBufferedRecordsDefault bounds the records the client holds,
	// buffered or in flight, across all Publish calls
	// (kgo.MaxBufferedRecords); Publish waits for room beyond it.
	MaxBufferedRecordsDefault = 10000
	// MaxBufferedRecordsMax is the largest MaxBufferedRecords accepted.
	MaxBufferedRecordsMax = 1 << 20

	// MaxMessageBytesDefault is Kafka's default message.max.bytes: a record
	// batch, and so a record with its key and headers, must not be larger.
	MaxMessageBytesDefault = 1048588
	// MaxMessageBytesMin and MaxMessageBytesMax bound MaxMessageBytes (the
	// range franz-go accepts).
	MaxMessageBytesMin = 512
	MaxMessageBytesMax = 1 << 30

	// KeyPipelineDefault is how many messages of one key the relay may pass
	// in one Publish call (see Options.KeyPipeline).
	KeyPipelineDefault = 8
	// KeyPipelineMax is the largest KeyPipeline accepted.
	KeyPipelineMax = 1024

	// DialTimeoutDefault bounds connecting to one broker.
	DialTimeoutDefault = 10 * time.Second

	// metadataMinAge is the least time between two metadata refreshes of
	// the client (franz-go's default is 5s).
	metadataMinAge = 500 * time.Millisecond
	// unknownTopicRetries is how many metadata answers in a row saying a
	// topic does not exist fail its records (franz-go's default is 4).
	unknownTopicRetries = 3

	// topicCacheTTL is how long a topic seen to exist is not checked again.
	topicCacheTTL = time.Minute
	// MaxTopicLen is the longest Kafka topic name.
	MaxTopicLen = 249
)

// Options configures a [Publisher]. Brokers is required; every other field
// has a default.
type Options struct {
	// Brokers are the seed brokers, host:port (at least one).
	Brokers []string
	// TopicMapper maps a message's Topic to its Kafka topic (default: the
	// topic itself). Its result must be a valid Kafka topic name (1 to 249
	// bytes of letters, digits, '.', '_' and '-', not "." or ".."); a message
	// mapped to an invalid name fails permanently. It is called
	// concurrently.
	TopicMapper func(topic string) string
	// AllowAutoTopicCreation lets the broker create a missing topic (if the
	// broker allows it, auto.create.topics.enable). By default a message to
	// a topic that does not exist fails with an error blocking its topic
	// (outbox.Blocked), naming it: the Publisher checks that each topic exists (with a metadata request,
	// cached for a minute) before producing to it.
	AllowAutoTopicCreation bool
	// DeliveryTimeout bounds how long a record may wait in the client,
	// including franz-go's own retries (which the idempotent producer needs
	// to keep its sequence numbers), before it fails with an error blocking
	// its topic (default DeliveryTimeoutDefault).
	DeliveryTimeout time.Duration
	// PublishTimeout bounds a Publish call whose context has no deadline
	// (default PublishTimeoutDefault).
	PublishTimeout time.Duration
	// MaxBufferedRecords bounds the records held by the client, across all
	// Publish calls (default MaxBufferedRecordsDefault, at most
	// MaxBufferedRecordsMax).
	MaxBufferedRecords int
	// MaxMessageBytes is the largest record batch the client sends
	// (kgo.ProducerBatchMaxBytes; default MaxMessageBytesDefault). Set it to
	// the broker's message.max.bytes (or the topic's max.message.bytes): a
	// record larger than it, with key and headers, fails permanently
	// without being sent.
	MaxMessageBytes int
	// Linger is how long a partition waits for more records before sending
	// a batch (kgo.ProducerLinger; default 0: send at once, batching the
	// records that arrive while a request is in flight).
	Linger time.Duration
	// KeyPipeline is how many messages of one key (to one topic) the relay
	// may pass in one Publish call (outbox.KeyPipeliner; default
	// KeyPipelineDefault; 1: one message per key per call, as publishers
	// that do not declare it get). Publish produces each of them once the
	// one before it is acknowledged (see pipeline.go): a key still has one
	// message in flight, but a backlog takes fewer Publish calls and
	// settlements (about a quarter of the calls with 1,000 keys).
	KeyPipeline int
	// DialTimeout bounds connecting to one broker (default
	// DialTimeoutDefault).
	DialTimeout time.Duration
	// ClientID is the client ID the brokers see (default "outbox-relay").
	ClientID string
	// Logger receives franz-go's warnings and errors (and, at debug level,
	// more). Default: discard.
	Logger *slog.Logger
	// ClientOptions are extra franz-go options, applied last: TLS
	// (kgo.DialTLSConfig), SASL (kgo.SASL), and so on. Options that would
	// weaken the guarantees (acks other than all, disabling idempotence)
	// are the caller's responsibility.
	ClientOptions []kgo.Opt
	// CloudEvents, if set, publishes every message as a CloudEvent in
	// binary or structured content mode (see package cloudevents for the
	// attributes and the Kafka ("ce_" headers, datacontenttype as content-type) binding's header names). Default: off.
	CloudEvents *cloudevents.Options
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.TopicMapper == nil {
		o.TopicMapper = func(topic string) string { return topic }
	}
	o.DeliveryTimeout = cmp.Or(o.DeliveryTimeout, DeliveryTimeoutDefault)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, PublishTimeoutDefault)
	o.MaxBufferedRecords = cmp.Or(o.MaxBufferedRecords, MaxBufferedRecordsDefault)
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, MaxMessageBytesDefault)
	o.DialTimeout = cmp.Or(o.DialTimeout, DialTimeoutDefault)
	o.KeyPipeline = cmp.Or(o.KeyPipeline, KeyPipelineDefault)
	o.ClientID = cmp.Or(o.ClientID, "outbox-relay")
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// validate checks o after WithDefaults, naming the field in its errors.
func (o Options) validate() error {
	if err := o.validateBrokers(); err != nil {
		return err
	}
	c := optcheck.Check("kafka")
	c.AtLeast("DeliveryTimeout", o.DeliveryTimeout, DeliveryTimeoutMin)
	c.AtLeast("PublishTimeout", o.PublishTimeout, PublishTimeoutMin)
	c.Between("MaxBufferedRecords", o.MaxBufferedRecords, 1, MaxBufferedRecordsMax)
	c.Between("MaxMessageBytes", o.MaxMessageBytes, MaxMessageBytesMin, MaxMessageBytesMax)
	c.Failf(o.KeyPipeline < 1 || o.KeyPipeline > KeyPipelineMax, "KeyPipeline must be between 1 (one message per key per call) and %d, got %d", KeyPipelineMax, o.KeyPipeline)
	c.Failf(o.Linger < 0, "Linger must not be negative, got %v", o.Linger)
	c.AtLeast("DialTimeout", o.DialTimeout, time.Millisecond)
	return c.Err()
}

// validateBrokers checks that Brokers lists host:port addresses.
func (o Options) validateBrokers() error {
	if len(o.Brokers) == 0 {
		return fmt.Errorf("kafka: Brokers is empty: give at least one seed broker as host:port, such as 127.0.0.1:9092")
	}
	for _, b := range o.Brokers {
		host, port, err := net.SplitHostPort(b)
		if err == nil && host == "" {
			err = fmt.Errorf("no host")
		}
		if err == nil {
			var n int
			n, err = strconv.Atoi(port)
			if err == nil && (n < 1 || n > 65535) {
				err = fmt.Errorf("port %d out of range", n)
			}
		}
		if err != nil {
			return fmt.Errorf("kafka: Brokers: %q is not host:port (%v); give addresses such as 127.0.0.1:9092", b, err)
		}
	}
	return nil
}

// validateTopic reports whether name is a valid Kafka topic name.
func validateTopic(name string) error {
	if err := optcheck.Name(name, MaxTopicLen, "._-"); err != nil {
		return err
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%q is not allowed", name)
	}
	return nil
}
