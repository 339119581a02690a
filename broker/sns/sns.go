// Package sns publishes outbox messages to Amazon SNS topics, standard and
// FIFO, through the AWS SDK for Go v2.
//
//	p, err := sns.Dial(ctx, sns.Options{Region: "eu-west-1", Account: "123456789012", FIFO: true})
//
// # Guarantees
//
//   - A nil result means SNS accepted the message (or, on a FIFO topic,
//     dropped it as a copy of one it took within 5 minutes).
//   - Per-key order on FIFO topics: MessageGroupId is the key (see
//     awsmsg.GroupID: the key, or a SHA-256 of it when SNS cannot take it
//     as is), and the relay sends a key's next message only after the
//     previous one was acknowledged; FIFO topics deliver a group in order
//     to FIFO queues. Standard topics keep no order.
//   - De-duplication on FIFO topics: MessageDeduplicationId is the outbox
//     ID (5-minute window). Standard topics do not de-duplicate; consumers
//     drop copies by the Outbox-Id attribute.
//   - A missing topic (NotFound), access denied, refused credentials,
//     throttling, SNS unavailable or unreachable, and no answer before the
//     deadline block the topic (outbox.Blocked); a message that can never
//     be published (over MaxMessageBytes, a key SNS cannot carry, an entry
//     refused as invalid) fails permanently.
//
// The body and attributes are those of the SQS publisher (Outbox-Id,
// Outbox-Key, Outbox-Created-At, headers as attributes or packed in
// Outbox-Headers, Outbox-Encoding for a body that is not text), so that a
// queue subscribed with raw message delivery receives what the SQS
// publisher would have sent it.
package sns

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Defaults and limits of [Options].
const (
	PublishTimeoutDefault        = 10 * time.Second
	MaxBatchEntries              = 10
	MaxMessageBytesDefault       = 256 << 10
	MaxMessageBytesMax           = 256 << 10
	MaxConcurrentRequestsDefault = 16
)

// Options configures a [Publisher].
type Options struct {
	// AWS is the SDK configuration; default: config.LoadDefaultConfig with
	// Profile (the AWS credential chain).
	AWS *aws.Config
	// Region overrides the configuration's region; Profile selects a
	// profile of the shared files (when AWS is nil).
	Region, Profile string
	// Endpoint overrides the SNS endpoint.
	Endpoint string
	// Account and Partition (default "aws") make a topic name into its ARN
	// (arn:PARTITION:sns:REGION:ACCOUNT:NAME). Account is needed unless
	// TopicMapper returns ARNs.
	Account, Partition string
	// TopicMapper maps a message's Topic to its SNS topic: a name or an
	// ARN (arn:…). Default: the topic with every '.' replaced by '-', plus
	// ".fifo" when FIFO is set. A name ending in ".fifo" is a FIFO topic.
	TopicMapper func(topic string) string
	// FIFO makes the default TopicMapper add ".fifo".
	FIFO bool
	// BatchEntries is how many messages go in one PublishBatch request
	// (default and at most MaxBatchEntries); 1 sends each with Publish.
	BatchEntries int
	// MaxMessageBytes bounds a message with its attributes (default and at
	// most 256 KiB), and the messages of one batch request together.
	MaxMessageBytes int
	// MaxConcurrentRequests bounds the requests of one Publish call.
	MaxConcurrentRequests int
	// PublishTimeout bounds a Publish call whose context has no deadline.
	PublishTimeout time.Duration
	// CloudEvents, if set, publishes every message as a CloudEvent
	// (cloudevents.SNS): in binary mode the event's attributes are
	// "ce-<name>" headers and the body is the data; in structured mode the
	// body is the event as JSON and the header "Content-Type" says so. The
	// headers travel as message attributes as always: with the binary
	// mode's attributes they are usually more than fit, so all of them go
	// packed in Outbox-Headers (see Publisher). Consumers read them with
	// cloudevents.MapHeaders and cloudevents.Decode(cloudevents.SNS, …).
	// Default: off.
	CloudEvents *cloudevents.Options

	// Logger receives warnings; default: discard.
	Logger *slog.Logger
	// ClientOptions are applied last to the SDK client's options.
	ClientOptions []func(*awssns.Options)
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.TopicMapper == nil {
		fifo := o.FIFO
		o.TopicMapper = func(topic string) string {
			name := strings.ReplaceAll(topic, ".", "-")
			if fifo {
				name += ".fifo"
			}
			return name
		}
	}
	o.Partition = cmp.Or(o.Partition, "aws")
	o.BatchEntries = cmp.Or(o.BatchEntries, MaxBatchEntries)
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, MaxMessageBytesDefault)
	o.MaxConcurrentRequests = cmp.Or(o.MaxConcurrentRequests, MaxConcurrentRequestsDefault)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, PublishTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports whether o, with its defaults, is usable, naming the
// field.
func (o Options) Validate() error { return o.WithDefaults().validate() }

func (o Options) validate() error {
	c := optcheck.Check("sns")
	c.Between("BatchEntries", o.BatchEntries, 1, MaxBatchEntries)
	c.Between("MaxMessageBytes", o.MaxMessageBytes, 1024, MaxMessageBytesMax)
	c.Between("MaxConcurrentRequests", o.MaxConcurrentRequests, 1, 1024)
	c.AtLeast("PublishTimeout", o.PublishTimeout, time.Millisecond)
	c.Failf(o.Account != "" && (len(o.Account) != 12 || strings.Trim(o.Account, "0123456789") != ""), "Account must be a 12-digit AWS account ID, got %q", o.Account)
	c.Failf(o.Endpoint != "" && !strings.HasPrefix(o.Endpoint, "http://") && !strings.HasPrefix(o.Endpoint, "https://"),
		"Endpoint %q must be a URL such as https://sns.eu-west-1.amazonaws.com", o.Endpoint)
	if o.CloudEvents != nil {
		err := o.CloudEvents.WithDefaults().Validate()
		c.Failf(err != nil, "CloudEvents: %w", err)
	}
	return c.Err()
}

// Publisher publishes outbox messages to SNS topics. It implements
// [outbox.Publisher] like the SQS publisher: PublishBatch requests of up
// to BatchEntries entries, sent concurrently, one result per message from
// the per-entry results; the SDK's retries are off. It is safe for
// concurrent use.
type Publisher struct {
	client *awssns.Client
	opts   Options
	region string
	gate   *pubgate.Gate
	ce     *cloudevents.Encoder // nil: CloudEvents off
}

// Dial builds an SNS client and checks that credentials and a region are
// configured; it sends no request.
func Dial(ctx context.Context, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cfg, err := awsmsg.LoadConfig(ctx, "sns", opts.AWS, opts.Profile, opts.Region, "sns://REGION")
	if err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.SNS)
	if err != nil {
		return nil, fmt.Errorf("sns: Options.CloudEvents: %w", err)
	}
	co := append([]func(*awssns.Options){func(o *awssns.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.Retryer = aws.NopRetryer{}
	}}, opts.ClientOptions...)
	return &Publisher{
		client: awssns.NewFromConfig(cfg, co...),
		opts:   opts,
		region: cfg.Region,
		gate:   pubgate.New(pubgate.Config{Name: "sns", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "answer"}),
		ce:     ce,
	}, nil
}

// TopicARN returns the ARN of an outbox topic.
func (p *Publisher) TopicARN(topic string) string {
	t := p.opts.TopicMapper(topic)
	if strings.HasPrefix(t, "arn:") {
		return t
	}
	return "arn:" + p.opts.Partition + ":sns:" + p.region + ":" + p.opts.Account + ":" + t
}

// Client returns the SDK client, for administration.
func (p *Publisher) Client() *awssns.Client { return p.client }

// Close makes later Publish calls fail with [outbox.ErrClosed] and waits
// for the calls in progress.
func (p *Publisher) Close() error {
	p.gate.Close()
	return nil
}

type entry struct {
	index int
	arn   string
	input types.PublishBatchRequestEntry
	size  int
}

// Publish implements [outbox.Publisher]; errors are classified as in the
// package documentation.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		byTopic := map[string][]*entry{}
		var order []string
		for i, m := range msgs {
			e, err := p.entry(i, m)
			if err != nil {
				errs[i] = outbox.Permanent(err)
				continue
			}
			if _, ok := byTopic[e.arn]; !ok {
				order = append(order, e.arn)
			}
			byTopic[e.arn] = append(byTopic[e.arn], e)
		}
		sem := make(chan struct{}, p.opts.MaxConcurrentRequests)
		var wg sync.WaitGroup
		for _, arn := range order {
			es := byTopic[arn]
			for len(es) > 0 {
				n, size := 0, 0
				for n < len(es) && n < p.opts.BatchEntries && (n == 0 || size+es[n].size <= p.opts.MaxMessageBytes) {
					size += es[n].size
					n++
				}
				chunk := es[:n]
				es = es[n:]
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					p.sendChunk(ctx, msgs, chunk, errs)
				})
			}
		}
		wg.Wait()
	})
}

// entry builds the SNS message of m.
func (p *Publisher) entry(i int, m *outbox.Message) (*entry, error) {
	arn := p.TopicARN(m.Topic)
	if m.ID == "" {
		return nil, errors.New("sns: message has no ID: messages must be written through a store (or prepared with Message.Prepare)")
	}
	name := arn[strings.LastIndex(arn, ":")+1:]
	if err := optcheck.Name(strings.TrimSuffix(name, ".fifo"), 256, "-_"); err != nil || strings.Count(arn, ":") != 5 || !strings.Contains(arn, ":sns:") {
		return nil, fmt.Errorf("sns: topic %q maps to %q, not a valid SNS topic ARN (arn:PARTITION:sns:REGION:ACCOUNT:NAME; set Options.Account): change the topic or Options.TopicMapper", m.Topic, arn)
	}
	if p.ce != nil {
		m, _ = p.ce.Encode(m)
	}
	am, err := awsmsg.Encode(m)
	if err != nil {
		return nil, fmt.Errorf("sns: topic %q: %w", name, err)
	}
	if am.Size > p.opts.MaxMessageBytes {
		return nil, fmt.Errorf("sns: topic %q: message %s is %d bytes with its attributes (payload %d), over MaxMessageBytes (%d; SNS allows 256 KiB): shrink it",
			name, m.ID, am.Size, len(m.Payload), p.opts.MaxMessageBytes)
	}
	attrs := make(map[string]types.MessageAttributeValue, len(am.Attrs))
	for k, v := range am.Attrs {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	e := &entry{index: i, arn: arn, size: am.Size, input: types.PublishBatchRequestEntry{
		Id: aws.String(strconv.Itoa(i)), Message: aws.String(am.Body), MessageAttributes: attrs,
	}}
	if strings.HasSuffix(name, ".fifo") {
		e.input.MessageGroupId = aws.String(awsmsg.GroupID(m.Key, m.ID))
		e.input.MessageDeduplicationId = aws.String(m.ID)
	}
	return e, nil
}

// sendChunk sends one request and sets its entries' results.
func (p *Publisher) sendChunk(ctx context.Context, msgs []*outbox.Message, chunk []*entry, errs []error) {
	e0 := chunk[0]
	if p.opts.BatchEntries == 1 {
		in := e0.input
		_, err := p.client.Publish(ctx, &awssns.PublishInput{
			TopicArn: aws.String(e0.arn), Message: in.Message, MessageAttributes: in.MessageAttributes,
			MessageGroupId: in.MessageGroupId, MessageDeduplicationId: in.MessageDeduplicationId,
		})
		errs[e0.index] = p.classify(ctx, msgs[e0.index].Topic, e0.arn, err, true)
		return
	}
	in := &awssns.PublishBatchInput{TopicArn: aws.String(e0.arn)}
	for _, e := range chunk {
		in.PublishBatchRequestEntries = append(in.PublishBatchRequestEntries, e.input)
	}
	out, err := p.client.PublishBatch(ctx, in)
	if err != nil {
		for _, e := range chunk {
			errs[e.index] = p.classify(ctx, msgs[e.index].Topic, e.arn, err, len(chunk) == 1)
		}
		return
	}
	done := map[string]bool{}
	for _, s := range out.Successful {
		done[aws.ToString(s.Id)] = true
	}
	failed := map[string]types.BatchResultErrorEntry{}
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = f
	}
	for _, e := range chunk {
		id, m := aws.ToString(e.input.Id), msgs[e.index]
		f, bad := failed[id]
		switch {
		case bad:
			code := aws.ToString(f.Code)
			err := fmt.Errorf("sns: topic %q: message %s: %s: %s", e.arn, m.ID, code, aws.ToString(f.Message))
			switch kind := awsmsg.BlockedKind(code); {
			case kind != "":
				errs[e.index] = outbox.Blocked(m.Topic, fmt.Errorf("%s: %w", kind, err))
			case f.SenderFault:
				errs[e.index] = outbox.Permanent(fmt.Errorf("SNS refuses the message as invalid: %w", err))
			default:
				errs[e.index] = err
			}
		case !done[id]:
			errs[e.index] = outbox.Blocked(m.Topic, fmt.Errorf("sns: topic %q: PublishBatch answered nothing for message %s (it may be published)", e.arn, m.ID))
		}
	}
}

// classify wraps err, the failure of a request to arn carrying a message
// of topic; single says it carried only that message.
func (p *Publisher) classify(ctx context.Context, topic, arn string, err error, single bool) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("sns: topic %q: %w", arn, err)
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		if kind := awsmsg.BlockedKind(code); kind != "" {
			return outbox.Blocked(topic, fmt.Errorf("%s: %w", kind, err))
		}
		if awsmsg.InvalidCodes[code] && single {
			return outbox.Permanent(fmt.Errorf("SNS refuses the message as invalid: %w", err))
		}
		return err
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return outbox.Blocked(topic, fmt.Errorf("no answer in time (the message may be published): %w", err))
	case ctx.Err() != nil:
		return fmt.Errorf("not answered (the message may be published): %w (%w)", context.Cause(ctx), err)
	}
	var send *smithyhttp.RequestSendError
	var deser *smithy.DeserializationError
	if errors.As(err, &send) || errors.As(err, &deser) {
		return outbox.Blocked(topic, fmt.Errorf("SNS is unreachable, or its answer was lost (the message may be published): %w", err))
	}
	return err
}

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker] with ListTopics (an
// access-denied answer counts as healthy: SNS answered).
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(func() error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, p.opts.PublishTimeout)
			defer cancel()
		}
		_, err := p.client.ListTopics(ctx, &awssns.ListTopicsInput{})
		var ae smithy.APIError
		if err == nil || errors.As(err, &ae) && (ae.ErrorCode() == "AuthorizationError" || strings.HasPrefix(ae.ErrorCode(), "AccessDenied")) {
			return nil
		}
		return fmt.Errorf("sns: %w", err)
	})
}
