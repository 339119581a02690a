package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Publisher sends outbox messages to Amazon SQS queues, standard and FIFO.
// It implements [outbox.Publisher]: the messages of a batch go in
// SendMessageBatch requests of up to BatchEntries entries (and
// MaxMessageBytes together), sent concurrently, and Publish returns one
// result per message from the per-entry results. Neither the Publisher nor
// its SDK client retries (the SDK's retryer is off): the relay does.
//
// Each message becomes an SQS message with:
//
//   - body: Message.Payload when it is text SQS accepts (UTF-8 without the
//     control characters SQS refuses), else its base64 (attribute
//     Outbox-Encoding "base64"); an empty payload is the body "-" with
//     Outbox-Encoding "empty";
//   - attributes (String): Outbox-Id, Outbox-Key (when not empty),
//     Outbox-Created-At, and each header as an attribute of its own name,
//     when they fit SQS's rules: at most 10 attributes in all, names of
//     letters, digits, '-', '_' and '.', non-empty values. Otherwise all
//     the headers travel together as one JSON object in the attribute
//     Outbox-Headers (so a message never loses a header, and never needs
//     more than 5 attributes);
//   - on a FIFO queue: MessageGroupId = the key (see GroupID: per-key
//     order, keys in parallel) and MessageDeduplicationId = Message.ID
//     (SQS drops a copy published again within its 5-minute window).
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client *awssqs.Client
	opts   Options
	gate   *pubgate.Gate
	ce     *cloudevents.Encoder // nil: CloudEvents off

	mu     sync.Mutex
	queues map[string]queueURL // queue name → URL
}

type queueURL struct {
	url  string
	seen time.Time
}

// QueryProtocol is a client option that makes the SDK speak SQS's query
// protocol (Action=SendMessageBatch&…, XML answers) instead of its JSON
// one: for servers that know only the older protocol, such as goaws. SQS
// itself speaks both.
func QueryProtocol(o *awssqs.Options) {
	o.Protocol = awsquery.New(&smithy.ServiceSchema{Version: "2012-11-05"})
}

// Dial builds an SQS client from opts and checks that credentials and a
// region are configured; it sends no request (SQS errors come per queue,
// at the first publish, and from Health). ctx bounds loading the
// configuration.
func Dial(ctx context.Context, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cfg, err := awsmsg.LoadConfig(ctx, "sqs", opts.AWS, opts.Profile, opts.Region, "?region= in the URL")
	if err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.SQS)
	if err != nil {
		return nil, fmt.Errorf("sqs: Options.CloudEvents: %w", err)
	}
	clientOpts := append([]func(*awssqs.Options){func(o *awssqs.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.Retryer = aws.NopRetryer{}
	}}, opts.ClientOptions...)
	p := &Publisher{
		client: awssqs.NewFromConfig(cfg, clientOpts...),
		opts:   opts,
		gate:   pubgate.New(pubgate.Config{Name: "sqs", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "answer"}),
		queues: map[string]queueURL{},
		ce:     ce,
	}
	return p, nil
}

// Client returns the SDK client, for administration.
func (p *Publisher) Client() *awssqs.Client { return p.client }

// Queue returns the queue (name or URL) of an outbox topic.
func (p *Publisher) Queue(topic string) string { return p.opts.QueueMapper(topic) }

// Close makes later Publish calls fail with [outbox.ErrClosed] and waits
// for the calls in progress to return. Calling Close again returns nil.
func (p *Publisher) Close() error {
	p.gate.Close()
	return nil
}

// entry is one message ready to send.
type entry struct {
	index int // in msgs
	queue string
	url   string
	fifo  bool
	input types.SendMessageBatchRequestEntry
	size  int
}

// Publish implements [outbox.Publisher]. It resolves each message's queue
// (GetQueueUrl, cached), sends the messages in batch requests and returns
// one result per message: nil when SQS stored it (or, on a FIFO queue,
// dropped it as a copy of one with the same ID within 5 minutes: SQS
// answers both the same way). Errors are classified:
//
//   - the message itself can never be sent: no ID, a topic mapped to an
//     invalid queue name, over MaxMessageBytes, a key or header SQS cannot
//     carry (invalid UTF-8, characters SQS refuses), or SQS refusing the
//     entry as invalid (a sender fault): [outbox.Permanent];
//   - the queue or SQS is unusable, or the outcome unknown: the queue does
//     not exist, access is denied (IAM, KMS), the credentials are refused,
//     requests are throttled, SQS is unavailable or unreachable, or no
//     answer came before ctx's deadline: [outbox.Blocked] with the
//     message's topic as destination;
//   - anything else (an internal error of SQS, a cancelled ctx):
//     retryable.
//
// The entries of one request keep their order; the relay passes one
// message per key per call, so a FIFO queue receives a key's messages in
// the order the relay publishes them.
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		entries := p.prepare(ctx, msgs, errs)
		p.send(ctx, msgs, entries, errs)
	})
}

// prepare builds the entries of the messages that can be sent and sets the
// errors of the others.
func (p *Publisher) prepare(ctx context.Context, msgs []*outbox.Message, errs []error) []*entry {
	urls := map[string]string{} // queue → URL, or "" when failed
	urlErr := map[string]error{}
	var entries []*entry
	for i, m := range msgs {
		queue := p.opts.QueueMapper(m.Topic)
		if m.ID == "" {
			errs[i] = outbox.Permanent(errors.New("sqs: message has no ID: messages must be written through a store (or prepared with Message.Prepare)"))
			continue
		}
		if !isURL(queue) {
			if err := validateQueueName(queue); err != nil {
				errs[i] = outbox.Permanent(fmt.Errorf("sqs: topic %q maps to an invalid queue name: %v; change the topic or Options.QueueMapper", m.Topic, err))
				continue
			}
		}
		url, ok := urls[queue]
		if !ok {
			url, urlErr[queue] = p.queueURL(ctx, queue)
			urls[queue] = url
		}
		if err := urlErr[queue]; err != nil {
			errs[i] = p.classify(ctx, m.Topic, queue, err, true)
			continue
		}
		e, err := p.entry(i, m, queue, url)
		if err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		entries = append(entries, e)
	}
	return entries
}

// isURL reports whether a QueueMapper result is a queue URL.
func isURL(q string) bool { return strings.HasPrefix(q, "https://") || strings.HasPrefix(q, "http://") }

// queueURL returns the URL of queue (a name or a URL).
func (p *Publisher) queueURL(ctx context.Context, queue string) (string, error) {
	if isURL(queue) {
		return queue, nil
	}
	p.mu.Lock()
	q, ok := p.queues[queue]
	p.mu.Unlock()
	if ok && time.Since(q.seen) < queueCacheTTL {
		return q.url, nil
	}
	out, err := p.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		return "", err
	}
	url := aws.ToString(out.QueueUrl)
	p.mu.Lock()
	p.queues[queue] = queueURL{url: url, seen: time.Now()}
	p.mu.Unlock()
	return url, nil
}

// forget drops a queue's cached URL (it was deleted).
func (p *Publisher) forget(queue string) {
	p.mu.Lock()
	delete(p.queues, queue)
	p.mu.Unlock()
}

// entry builds the SQS message of m.
func (p *Publisher) entry(i int, m *outbox.Message, queue, url string) (*entry, error) {
	if p.ce != nil {
		m, _ = p.ce.Encode(m)
	}
	am, err := awsmsg.Encode(m)
	if err != nil {
		return nil, fmt.Errorf("sqs: queue %q: %w", queue, err)
	}
	if am.Size > p.opts.MaxMessageBytes {
		return nil, fmt.Errorf("sqs: queue %q: message %s is %d bytes with its attributes (payload %d), over MaxMessageBytes (%d; SQS allows 256 KiB, or up to 1 MiB where the queue's MaximumMessageSize is raised): shrink it",
			queue, m.ID, am.Size, len(m.Payload), p.opts.MaxMessageBytes)
	}
	attrs := make(map[string]types.MessageAttributeValue, len(am.Attrs))
	for k, v := range am.Attrs {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	e := &entry{index: i, queue: queue, url: url, fifo: strings.HasSuffix(queue, ".fifo"), size: am.Size}
	e.input = types.SendMessageBatchRequestEntry{
		Id:                aws.String(strconv.Itoa(i)),
		MessageBody:       aws.String(am.Body),
		MessageAttributes: attrs,
	}
	if e.fifo {
		e.input.MessageGroupId = aws.String(GroupID(m.Key, m.ID))
		e.input.MessageDeduplicationId = aws.String(m.ID)
	}
	return e, nil
}

// GroupID is the MessageGroupId of a message with key and id on a FIFO
// queue: the key itself when SQS accepts it (1 to 128 printable ASCII
// characters without space), else "outbox-sha256-" and the hex SHA-256 of
// the key (so one key is always one group); a message without key gets
// its own group (its ID): no order, as the outbox promises none for it.
func GroupID(key, id string) string { return awsmsg.GroupID(key, id) }

// send sends the entries in requests of up to BatchEntries entries and
// MaxMessageBytes, grouped by queue in msgs order, at most
// MaxConcurrentRequests at once.
func (p *Publisher) send(ctx context.Context, msgs []*outbox.Message, entries []*entry, errs []error) {
	byQueue := map[string][]*entry{}
	var order []string
	for _, e := range entries {
		if _, ok := byQueue[e.url]; !ok {
			order = append(order, e.url)
		}
		byQueue[e.url] = append(byQueue[e.url], e)
	}
	sem := make(chan struct{}, p.opts.MaxConcurrentRequests)
	var wg sync.WaitGroup
	for _, url := range order {
		es := byQueue[url]
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
}

// sendChunk sends one request and sets its entries' results.
func (p *Publisher) sendChunk(ctx context.Context, msgs []*outbox.Message, chunk []*entry, errs []error) {
	e0 := chunk[0]
	if p.opts.BatchEntries == 1 {
		in := e0.input
		_, err := p.client.SendMessage(ctx, &awssqs.SendMessageInput{
			QueueUrl: aws.String(e0.url), MessageBody: in.MessageBody, MessageAttributes: in.MessageAttributes,
			MessageGroupId: in.MessageGroupId, MessageDeduplicationId: in.MessageDeduplicationId,
		})
		errs[e0.index] = p.classify(ctx, msgs[e0.index].Topic, e0.queue, err, true)
		return
	}
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(e0.url)}
	for _, e := range chunk {
		in.Entries = append(in.Entries, e.input)
	}
	out, err := p.client.SendMessageBatch(ctx, in)
	if err != nil {
		for _, e := range chunk {
			errs[e.index] = p.classify(ctx, msgs[e.index].Topic, e.queue, err, len(chunk) == 1)
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
		id := aws.ToString(e.input.Id)
		m := msgs[e.index]
		if f, ok := failed[id]; ok {
			errs[e.index] = p.entryError(m, e.queue, f)
		} else if !done[id] {
			errs[e.index] = outbox.Blocked(m.Topic, fmt.Errorf("sqs: queue %q: SendMessageBatch answered nothing for message %s (the message may be stored)", e.queue, m.ID))
		}
	}
}

// entryError classifies a failed entry of SendMessageBatch.
func (p *Publisher) entryError(m *outbox.Message, queue string, f types.BatchResultErrorEntry) error {
	code := aws.ToString(f.Code)
	err := fmt.Errorf("sqs: queue %q: message %s: %s: %s", queue, m.ID, code, aws.ToString(f.Message))
	switch kind := awsmsg.BlockedKind(code); {
	case kind != "":
		return outbox.Blocked(m.Topic, fmt.Errorf("%s: %w", kind, err))
	case f.SenderFault:
		return outbox.Permanent(fmt.Errorf("SQS refuses the message as invalid: %w", err))
	}
	return err
}

// classify wraps err, the failure of a request to queue carrying a message
// of topic. single says the request carried only that message: only then
// does an invalid request mean an invalid message.
func (p *Publisher) classify(ctx context.Context, topic, queue string, err error, single bool) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("sqs: queue %q: %w", queue, err)
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		if kind := awsmsg.BlockedKind(code); kind != "" {
			if kind == awsmsg.Missing {
				p.forget(queue)
			}
			return outbox.Blocked(topic, fmt.Errorf("%s: %w", kind, err))
		}
		if awsmsg.InvalidCodes[code] && single {
			return outbox.Permanent(fmt.Errorf("SQS refuses the message as invalid: %w", err))
		}
		return err
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return outbox.Blocked(topic, fmt.Errorf("no answer in time (the message may be stored): %w", err))
	case ctx.Err() != nil:
		return fmt.Errorf("not answered (the message may be stored): %w (%w)", context.Cause(ctx), err)
	}
	var send *smithyhttp.RequestSendError
	var deser *smithy.DeserializationError
	if errors.As(err, &send) || errors.As(err, &deser) {
		return outbox.Blocked(topic, fmt.Errorf("SQS is unreachable, or its answer was lost (the message may be stored): %w", err))
	}
	return err
}
