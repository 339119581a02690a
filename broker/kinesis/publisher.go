package kinesis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Publisher sends outbox messages to Kinesis data streams. It implements
// [outbox.Publisher]: the messages of a batch go in PutRecords requests of
// up to MaxBatchRecords records (and MaxRequestBytes together), sent
// concurrently, and Publish returns one result per message from the
// per-record results. Neither the Publisher nor its SDK client retries (the
// SDK's retryer is off): the relay does.
//
// Each message becomes a record of stream StreamMapper(Topic) with:
//
//   - partition key: the message key (see PartitionKey: a key Kinesis
//     cannot take as is is hashed; a message without key gets its ID);
//   - data: the envelope (see Encode): one JSON line with the ID, topic,
//     key, creation time and headers, a newline, then the payload.
//
// A key's messages within one call are sent one after the other (see the
// package documentation), so a failed record is never overtaken by a later
// record of its key.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client *awskinesis.Client
	opts   Options
	gate   *pubgate.Gate
	ce     *cloudevents.Encoder // nil: CloudEvents off
}

// Dial builds a Kinesis client from opts and checks that credentials and a
// region are configured; it sends no request (Kinesis errors come per
// stream, at the first publish, and from Health). ctx bounds loading the
// configuration.
func Dial(ctx context.Context, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cfg, err := awsmsg.LoadConfig(ctx, "kinesis", opts.AWS, opts.Profile, opts.Region, "the host of the kinesis:// URL")
	if err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.Kinesis)
	if err != nil {
		return nil, fmt.Errorf("kinesis: Options.CloudEvents: %w", err)
	}
	clientOpts := append([]func(*awskinesis.Options){func(o *awskinesis.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.Retryer = aws.NopRetryer{}
	}}, opts.ClientOptions...)
	return &Publisher{
		client: awskinesis.NewFromConfig(cfg, clientOpts...),
		opts:   opts,
		gate:   pubgate.New(pubgate.Config{Name: "kinesis", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "answer"}),
		ce:     ce,
	}, nil
}

// Client returns the SDK client, for administration.
func (p *Publisher) Client() *awskinesis.Client { return p.client }

// Stream returns the stream (name or ARN) of an outbox topic.
func (p *Publisher) Stream(topic string) string { return p.opts.StreamMapper(topic) }

// Close makes later Publish calls fail with [outbox.ErrClosed] and waits
// for the calls in progress to return. Calling Close again returns nil.
func (p *Publisher) Close() error {
	p.gate.Close()
	return nil
}

// record is one message ready to send.
type record struct {
	index  int // in msgs
	stream string
	entry  types.PutRecordsRequestEntry
	size   int // data and partition key
}

// Publish implements [outbox.Publisher]. It sends the messages in
// PutRecords requests and returns one result per message: nil when Kinesis
// stored its record. Errors are classified:
//
//   - the message itself can never be sent: no ID, a topic mapped to an
//     invalid stream name, a record over MaxRecordBytes, a key or header
//     that is not UTF-8, or Kinesis refusing the record alone as invalid:
//     [outbox.Permanent];
//   - the stream or Kinesis is unusable: the stream does not exist (or is
//     not ACTIVE), access is denied (IAM, KMS), the credentials are
//     refused, the throughput is exceeded (a record's or the request's),
//     Kinesis is unavailable or unreachable, or the connection closed
//     before its answer: [outbox.Blocked] with the message's topic as
//     destination;
//   - anything else (a record's InternalFailure, no answer before ctx's
//     deadline, a cancelled ctx, a message not sent because an earlier one
//     of its key in the call failed): retryable.
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		recs := make([]*record, len(msgs))
		for i, m := range msgs {
			recs[i], errs[i] = p.record(i, m)
		}
		// round[i] is how many messages of msgs[i]'s key come before it in
		// the call; prev[i] the index of the one right before it, or -1.
		round, prev := make([]int, len(msgs)), make([]int, len(msgs))
		last := map[string]int{}
		rounds := 1
		for i, m := range msgs {
			prev[i] = -1
			if m.Key == "" {
				continue
			}
			if j, ok := last[m.Key]; ok {
				prev[i], round[i] = j, round[j]+1
				rounds = max(rounds, round[i]+1)
			}
			last[m.Key] = i
		}
		for r := range rounds {
			var batch []*record
			for i, rec := range recs {
				if round[i] != r || rec == nil {
					continue
				}
				if j := prev[i]; j >= 0 && errs[j] != nil {
					errs[i] = notSent(msgs[i], msgs[j], errs[j])
					continue
				}
				batch = append(batch, rec)
			}
			p.send(ctx, msgs, batch, errs)
		}
	})
}

// notSent is the error of m, not sent because earlier, a message of its key
// before it in the same call, failed with err: blocked like it, or
// retryable.
func notSent(m, earlier *outbox.Message, err error) error {
	e := fmt.Errorf("kinesis: message %s not sent: message %s of key %q before it in this call failed, and Kinesis keeps a key's order only if its records are sent one after the other", m.ID, earlier.ID, m.Key)
	if _, blocked := outbox.IsBlocked(err); blocked {
		return outbox.Blocked(m.Topic, e)
	}
	return e
}

// record builds m's record, or returns the permanent error of a message
// that can never be sent.
func (p *Publisher) record(i int, m *outbox.Message) (*record, error) {
	stream := p.opts.StreamMapper(m.Topic)
	if err := validateStream(stream); err != nil {
		return nil, outbox.Permanent(fmt.Errorf("kinesis: topic %q maps to an invalid stream: %v; change the topic or Options.StreamMapper", m.Topic, err))
	}
	if p.ce != nil {
		m, _ = p.ce.Encode(m)
	}
	data, err := Encode(m)
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("kinesis: stream %q: %w", stream, err))
	}
	pk := PartitionKey(m.Key, m.ID)
	size := len(data) + len(pk)
	if size > p.opts.MaxRecordBytes {
		return nil, outbox.Permanent(fmt.Errorf("kinesis: stream %q: message %s is %d bytes as a record (payload %d, envelope and partition key %d), over MaxRecordBytes (%d; Kinesis takes 1 MiB, up to 10 MiB where the stream's maximum record size is raised): shrink it",
			stream, m.ID, size, len(m.Payload), size-len(m.Payload), p.opts.MaxRecordBytes))
	}
	return &record{index: i, stream: stream, size: size,
		entry: types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(pk)}}, nil
}

// send sends recs (at most one per key) in requests of up to
// MaxBatchRecords records and MaxRequestBytes, grouped by stream in msgs
// order, at most MaxConcurrentRequests at once, and returns when every
// request has been answered.
func (p *Publisher) send(ctx context.Context, msgs []*outbox.Message, recs []*record, errs []error) {
	byStream := map[string][]*record{}
	var order []string
	for _, r := range recs {
		if _, ok := byStream[r.stream]; !ok {
			order = append(order, r.stream)
		}
		byStream[r.stream] = append(byStream[r.stream], r)
	}
	sem := make(chan struct{}, p.opts.MaxConcurrentRequests)
	var wg sync.WaitGroup
	for _, stream := range order {
		rs := byStream[stream]
		for len(rs) > 0 {
			n, size := 0, 0
			for n < len(rs) && n < p.opts.MaxBatchRecords && (n == 0 || size+rs[n].size <= MaxRequestBytes) {
				size += rs[n].size
				n++
			}
			chunk := rs[:n]
			rs = rs[n:]
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				p.sendChunk(ctx, msgs, chunk, errs)
			})
		}
	}
	wg.Wait()
}

// sendChunk sends one PutRecords request and sets its records' results.
func (p *Publisher) sendChunk(ctx context.Context, msgs []*outbox.Message, chunk []*record, errs []error) {
	stream := chunk[0].stream
	in := &awskinesis.PutRecordsInput{Records: make([]types.PutRecordsRequestEntry, len(chunk))}
	if isARN(stream) {
		in.StreamARN = aws.String(stream)
	} else {
		in.StreamName = aws.String(stream)
	}
	for k, r := range chunk {
		in.Records[k] = r.entry
	}
	out, err := p.client.PutRecords(ctx, in)
	if err != nil {
		if len(chunk) > 1 && invalidRequest(err) && ctx.Err() == nil {
			// Kinesis refused the request as a whole and stored none of its
			// records: find the one at fault by sending each alone, so that
			// only it fails permanently.
			for _, r := range chunk {
				p.sendChunk(ctx, msgs, []*record{r}, errs)
			}
			return
		}
		for _, r := range chunk {
			errs[r.index] = p.classify(ctx, msgs[r.index].Topic, stream, err, len(chunk) == 1)
		}
		return
	}
	if len(out.Records) != len(chunk) {
		for _, r := range chunk {
			errs[r.index] = fmt.Errorf("kinesis: stream %q: PutRecords answered %d results for %d records (the records may be stored)", stream, len(out.Records), len(chunk))
		}
		return
	}
	for k, res := range out.Records {
		r := chunk[k]
		m := msgs[r.index]
		switch {
		case res.ErrorCode != nil:
			errs[r.index] = recordError(m, stream, aws.ToString(res.ErrorCode), aws.ToString(res.ErrorMessage))
		case res.SequenceNumber == nil:
			errs[r.index] = fmt.Errorf("kinesis: stream %q: message %s: PutRecords answered neither a sequence number nor an error (the record may be stored)", stream, m.ID)
		default:
			errs[r.index] = nil
		}
	}
}

// recordError classifies a record PutRecords failed.
func recordError(m *outbox.Message, stream, code, msg string) error {
	err := fmt.Errorf("kinesis: stream %q: message %s: %s: %s", stream, m.ID, code, msg)
	if kind := blockedKind(code); kind != "" {
		return outbox.Blocked(m.Topic, fmt.Errorf("%s: %w", kind, err))
	}
	return err // InternalFailure and the unknown: retryable
}

// Why an error code blocks the stream.
const (
	kindMissing     = "the stream does not exist or is not ACTIVE: create it, or wait for it to be ACTIVE"
	kindDenied      = "access denied: grant the relay's role kinesis:PutRecords on the stream (and kms:GenerateDataKey on its key, if encrypted)"
	kindCredentials = "AWS refuses the credentials"
	kindThrottled   = "throttled: the stream's or the account's throughput is exceeded (add shards, or use on-demand mode)"
	kindUnavailable = "Kinesis is unavailable"
)

// blockedKind says why a Kinesis error code blocks the stream, or "" when
// it does not.
func blockedKind(code string) string {
	switch code {
	case "ResourceNotFoundException", "ResourceInUseException":
		return kindMissing
	case "AccessDeniedException", "AccessDenied", "KMSAccessDeniedException", "KMSDisabledException", "KMSNotFoundException",
		"KMSInvalidStateException", "KMSOptInRequired":
		return kindDenied
	case "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException", "ExpiredToken",
		"MissingAuthenticationToken", "IncompleteSignature", "InvalidClientTokenId", "SignatureDoesNotMatch":
		return kindCredentials
	case "ProvisionedThroughputExceededException", "LimitExceededException", "ThrottlingException", "Throttling",
		"KMSThrottlingException", "RequestLimitExceeded":
		return kindThrottled
	case "ServiceUnavailable", "ServiceUnavailableException":
		return kindUnavailable
	}
	return ""
}

// invalidCodes are request error codes meaning the request's records are
// invalid.
var invalidCodes = map[string]bool{
	"InvalidArgumentException": true, "ValidationException": true, "SerializationException": true,
}

// invalidRequest reports whether Kinesis refused a request as invalid.
func invalidRequest(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && invalidCodes[ae.ErrorCode()]
}

// classify wraps err, the failure of a request to stream carrying a message
// of topic. single says the request carried only that message: only then
// does an invalid request mean an invalid message.
func (p *Publisher) classify(ctx context.Context, topic, stream string, err error, single bool) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("kinesis: stream %q: %w", stream, err)
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		if kind := blockedKind(code); kind != "" {
			return outbox.Blocked(topic, fmt.Errorf("%s: %w", kind, err))
		}
		if invalidCodes[code] && single {
			return outbox.Permanent(fmt.Errorf("Kinesis refuses the record as invalid: %w", err))
		}
		return err
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("no answer in time (the records may be stored): %w", err)
	case ctx.Err() != nil:
		return fmt.Errorf("not answered (the records may be stored): %w (%w)", context.Cause(ctx), err)
	}
	var send *smithyhttp.RequestSendError
	var deser *smithy.DeserializationError
	if errors.As(err, &send) || errors.As(err, &deser) || strings.Contains(err.Error(), "connection reset") {
		return outbox.Blocked(topic, fmt.Errorf("Kinesis is unreachable, or the connection closed before its answer (the records may be stored): %w", err))
	}
	return err
}
