package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"

	"github.com/outboxrelay/outbox/broker/internal/pubgate"
)

// Publisher publishes outbox messages to Kafka with franz-go's idempotent
// producer and acks=all. It implements [outbox.Publisher]: every message of
// a batch is produced at once, and Publish returns one result per message
// once the brokers have acknowledged (or refused) each. It classifies each
// failure as [outbox.Permanent] (the message can never be produced),
// [outbox.Blocked] (the topic or the brokers are unusable, or the outcome
// unknown) or retryable (see Publish). (franz-go
// retries a produce request internally, within DeliveryTimeout, as the
// idempotent producer must to keep its sequence numbers; the Publisher adds
// no retries of its own.)
//
// Each message becomes a record of topic TopicMapper(Topic) with:
//
//   - key: Message.Key (none when empty), so that the messages of a key go
//     to one partition, in order;
//   - value: Message.Payload;
//   - headers: the message's own, plus Outbox-Id (Message.ID) and
//     Outbox-Created-At (Message.CreatedAt, RFC 3339 with nanoseconds, UTC).
//
// The record timestamp is the produce time, not CreatedAt, so that
// time-based retention counts from publication.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client *kgo.Client
	opts   Options

	gate *pubgate.Gate

	topicsMu sync.Mutex
	topics   map[string]time.Time // topic → when it was last seen to exist

	ce *cloudevents.Encoder // nil: CloudEvents off
}

// Dial creates a franz-go client for opts.Brokers and checks that a broker
// answers. ctx bounds the check. Errors name the brokers and say what to
// change.
func Dial(ctx context.Context, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.Kafka)
	if err != nil {
		return nil, fmt.Errorf("kafka: Options.CloudEvents: %w", err)
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ClientID(opts.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the default, and required by idempotence
		kgo.RecordDeliveryTimeout(opts.DeliveryTimeout),
		kgo.MaxBufferedRecords(opts.MaxBufferedRecords),
		kgo.ProducerBatchMaxBytes(int32(opts.MaxMessageBytes)),
		kgo.ProducerLinger(opts.Linger),
		kgo.DialTimeout(opts.DialTimeout),
		// A topic deleted after the metadata check fails after a few
		// metadata refreshes, not after DeliveryTimeout: refreshes
		// triggered by errors may come every metadataMinAge, and three
		// unknown-topic answers in a row fail the records (about 1.5 s).
		kgo.MetadataMinAge(metadataMinAge),
		kgo.UnknownTopicRetries(unknownTopicRetries),
		kgo.WithLogger(slogLogger{opts.Logger}),
	}
	if opts.AllowAutoTopicCreation {
		kopts = append(kopts, kgo.AllowAutoTopicCreation())
	}
	kopts = append(kopts, opts.ClientOptions...)
	client, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: brokers %v: %w", opts.Brokers, err)
	}
	if err := client.Ping(ctx); err != nil {
		client.Close()
		if !unreachable(err) {
			return nil, fmt.Errorf("kafka: brokers %v: %w", opts.Brokers, err)
		}
		return nil, fmt.Errorf("kafka: no broker of %v answers: %w; check Brokers (host:port of running Kafka brokers) and the network", opts.Brokers, err)
	}
	gate := pubgate.New(pubgate.Config{Name: "kafka", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "acknowledgement"})
	return &Publisher{client: client, opts: opts, gate: gate, topics: map[string]time.Time{}, ce: ce}, nil
}

// Client returns the franz-go client, for metrics and administration. Do
// not close it: Close does.
func (p *Publisher) Client() *kgo.Client { return p.client }

// Topic returns the Kafka topic of an outbox topic: TopicMapper(topic).
func (p *Publisher) Topic(topic string) string { return p.opts.TopicMapper(topic) }

// Close makes later Publish calls fail with [outbox.ErrClosed], waits for
// the calls in progress to return (at most their deadline, or
// PublishTimeout), and closes the client, failing the records still
// buffered. Calling Close again returns nil.
func (p *Publisher) Close() error {
	if p.gate.Close() {
		p.client.Close()
	}
	return nil
}

// produced is the result of one record.
type produced struct {
	index int
	err   error
}

// Publish implements [outbox.Publisher]. It checks that the batch's topics
// exist (unless AllowAutoTopicCreation), produces every message, and waits
// for every acknowledgement until ctx ends (or PublishTimeout passes, if ctx
// has no deadline). It returns one result per message: nil when the
// brokers acknowledged the record (acks=all). (The idempotent producer
// has no duplicate acknowledgement to report.) When ctx ends first,
// Publish returns promptly with an error for every message not yet
// acknowledged; those may still be produced. Errors are classified:
//
//   - the message itself can never be produced: a record larger than
//     MaxMessageBytes or the broker's limit, an invalid topic name, a
//     record the broker refuses as invalid (such as one without key for a
//     compacted topic): [outbox.Permanent];
//   - the topic or the brokers are unusable, or the outcome unknown: the
//     topic does not exist (UNKNOWN_TOPIC_OR_PARTITION), the client is not
//     authorised (TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
//     SASL authentication), the brokers are unreachable or the record was
//     not acknowledged within DeliveryTimeout or ctx's deadline, or the
//     brokers answered with an error Kafka calls retriable (leader changes,
//     not enough replicas, request timeouts): [outbox.Blocked] with the
//     message's topic as destination;
//   - anything else, and a cancelled ctx: retryable.
//
// Several messages of one key and topic in a call are produced one after
// the other, each once the one before it is acknowledged; when one fails,
// the later ones are not produced (a retryable error). See chain.
//
// franz-go fails a partition's buffered records together, by the context
// of the first: a call cancelled while its records wait in the buffer
// takes with it the records other calls buffered behind them. A call whose
// own ctx is live produces such a message again, up to three times
// (still first of its key in the call, so the key's order holds).
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		topics := p.build(ctx, msgs, errs)
		p.await(ctx, msgs, topics, p.send(ctx, msgs, topics, errs), errs)
	})
}

// build maps each message to its Kafka topic and sets the errors of the
// messages that cannot be produced: an invalid topic name, no ID, or (unless
// AllowAutoTopicCreation) a topic that does not exist.
func (p *Publisher) build(ctx context.Context, msgs []*outbox.Message, errs []error) (topics []string) {
	topics = make([]string, len(msgs))
	for i, m := range msgs {
		topics[i] = p.opts.TopicMapper(m.Topic)
		if err := validateTopic(topics[i]); err != nil {
			errs[i] = outbox.Permanent(fmt.Errorf("kafka: topic %q maps to an invalid Kafka topic name: %v; change the topic or Options.TopicMapper", m.Topic, err))
		} else if m.ID == "" {
			errs[i] = outbox.Permanent(errors.New("kafka: message has no ID: messages must be written through a store (or prepared with Message.Prepare)"))
		}
	}
	if !p.opts.AllowAutoTopicCreation {
		p.checkTopics(ctx, msgs, topics, errs)
	}
	return topics
}

// sending is the produce state of one Publish call.
type sending struct {
	results  chan produced
	awaiting []bool // produced or waiting for its turn, no result yet
	sent     []bool // produced
	next     runs   // the next message of each one's key and topic (see chain)
	// again counts, per message, the times it was produced again after
	// another call's cancellation failed it (see othersCancellation).
	again []uint8
}

// send produces the messages without an error yet, except those waiting
// for the acknowledgement of the one before them of their key and topic
// (see chain): await produces those in their turn. Results come on
// s.results.
func (p *Publisher) send(ctx context.Context, msgs []*outbox.Message, topics []string, errs []error) *sending {
	s := &sending{
		results:  make(chan produced, len(msgs)),
		awaiting: make([]bool, len(msgs)),
		sent:     make([]bool, len(msgs)),
		next:     chain(msgs, topics, errs),
		again:    make([]uint8, len(msgs)),
	}
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		s.awaiting[i] = true
		if !s.next.waits(i) {
			p.produce(ctx, s, i, topics[i], msgs[i])
		}
	}
	return s
}

// produce produces message i of the call.
func (p *Publisher) produce(ctx context.Context, s *sending, i int, topic string, m *outbox.Message) {
	s.sent[i] = true
	p.client.Produce(ctx, p.record(topic, m), func(_ *kgo.Record, err error) {
		s.results <- produced{i, err} // never blocks: room for every message
	})
}

// await sets the results of the messages sent, as they come, producing the
// next message of a key once the one before it is acknowledged, until
// every one has come or ctx ends; then the messages still awaited fail.
func (p *Publisher) await(ctx context.Context, msgs []*outbox.Message, topics []string, s *sending, errs []error) {
	pending := 0
	for _, wait := range s.awaiting {
		if wait {
			pending++
		}
	}
	settle := func(r produced) {
		if othersCancellation(ctx, r.err) && s.again[r.index] < producedAgainMax {
			// Not this call's failure: franz-go failed the record with the
			// buffered records of a call cancelled before it, in the same
			// partition. Produced again, still first of its key in this
			// call (the next waits for its acknowledgement), so the key's
			// order holds.
			s.again[r.index]++
			p.produce(ctx, s, r.index, topics[r.index], msgs[r.index])
			return
		}
		errs[r.index] = p.classify(ctx, topics[r.index], msgs[r.index], r.err)
		s.awaiting[r.index] = false
		pending--
		for j := s.next.after(r.index); j >= 0; j = s.next.after(j) {
			if errs[r.index] == nil {
				p.produce(ctx, s, j, topics[j], msgs[j]) // the one before it is written: its turn
				break
			}
			errs[j] = fmt.Errorf("kafka: produce to topic %q: %w", topics[j], errNotProduced)
			s.awaiting[j] = false
			pending--
		}
	}
	for pending > 0 {
		select {
		case r := <-s.results:
			settle(r)
		case <-ctx.Done():
			// Results that arrived meanwhile still count.
			for drained := false; !drained && pending > 0; {
				select {
				case r := <-s.results:
					settle(r)
				default:
					drained = true
				}
			}
			for i, wait := range s.awaiting {
				if wait {
					errs[i] = fmt.Errorf("kafka: produce to topic %q: not acknowledged (the record may still be produced): %w", topics[i], context.Cause(ctx))
					if !s.sent[i] {
						errs[i] = fmt.Errorf("kafka: produce to topic %q: not produced: the earlier message of its key was not acknowledged in time: %w", topics[i], context.Cause(ctx))
					}
					if errors.Is(ctx.Err(), context.DeadlineExceeded) {
						// The brokers did not take it in time: unreachable,
						// or the topic unusable.
						errs[i] = outbox.Blocked(msgs[i].Topic, errs[i])
					}
				}
			}
			return
		}
	}
}

// producedAgainMax bounds how many times one Publish call produces a
// message again after other calls' cancellations failed it.
const producedAgainMax = 3

// othersCancellation reports whether err failed a record of a call whose
// own ctx is live: franz-go fails a partition's buffered records together,
// by the context of the first, so a cancelled call takes the records that
// other calls buffered behind its own with it.
func othersCancellation(ctx context.Context, err error) bool {
	return (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && ctx.Err() == nil
}

// record builds the Kafka record for m.
func (p *Publisher) record(topic string, m *outbox.Message) *kgo.Record {
	if p.ce != nil {
		m, _ = p.ce.Encode(m)
	}
	r := &kgo.Record{Topic: topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+2)
	for k, v := range m.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: []byte(m.ID)})
	if !m.CreatedAt.IsZero() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderCreatedAt, Value: []byte(m.CreatedAt.UTC().Format(time.RFC3339Nano))})
	}
	return r
}

// classify wraps err, the failure to produce m to topic: permanent when
// the message itself can never be produced, blocked when the topic or the
// brokers are unusable or the outcome unknown, else retryable.
func (p *Publisher) classify(ctx context.Context, topic string, m *outbox.Message, err error) error {
	if err == nil {
		return nil
	}
	var ke *kerr.Error
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return outbox.Permanent(fmt.Errorf("kafka: produce to topic %q: message %s (payload %d bytes, key %d bytes, plus headers) exceeds MaxMessageBytes (%d) or the broker's message.max.bytes: shrink it, or raise both limits: %w",
			topic, m.ID, len(m.Payload), len(m.Key), p.opts.MaxMessageBytes, err))
	case errors.Is(err, kerr.InvalidTopicException):
		return outbox.Permanent(fmt.Errorf("kafka: produce to topic %q: invalid topic: %w", topic, err))
	case errors.Is(err, kerr.InvalidRecord):
		return outbox.Permanent(fmt.Errorf("kafka: produce to topic %q: the broker refuses message %s as invalid (a compacted topic needs a key): %w", topic, m.ID, err))
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		p.forgetTopic(topic)
		return outbox.Blocked(m.Topic, missingTopic(topic, err))
	case strings.Contains(err.Error(), purgedText):
		return outbox.Blocked(m.Topic, missingTopic(topic, err))
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return outbox.Blocked(m.Topic, notAuthorized(topic, err))
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism):
		return outbox.Blocked(m.Topic, fmt.Errorf("kafka: produce to topic %q: the brokers refused the client's credentials (SASL): check the user, password and mechanism: %w", topic, err))
	case errors.Is(err, kgo.ErrClientClosed):
		return fmt.Errorf("kafka: produce to topic %q: %w (%w)", topic, outbox.ErrClosed, err)
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries):
		return outbox.Blocked(m.Topic, fmt.Errorf("kafka: produce to topic %q: not acknowledged within DeliveryTimeout (%v): are the brokers reachable, and the topic's partitions led? %w", topic, p.opts.DeliveryTimeout, err))
	case errors.As(err, &ke) && ke.Retriable:
		return outbox.Blocked(m.Topic, fmt.Errorf("kafka: produce to topic %q: %w", topic, err))
	case othersCancellation(ctx, err):
		// franz-go fails a partition's buffered records together, by the
		// context of the first: another call's cancellation.
		return fmt.Errorf("kafka: produce to topic %q: failed with the records of a cancelled call sharing its partition's buffer: %w", topic, err)
	case errors.Is(err, context.DeadlineExceeded):
		return outbox.Blocked(m.Topic, fmt.Errorf("kafka: produce to topic %q: not acknowledged in time (the record may still be produced): %w", topic, err))
	}
	return fmt.Errorf("kafka: produce to topic %q: %w", topic, err)
}

func notAuthorized(topic string, err error) error {
	return fmt.Errorf("kafka: produce to topic %q: not authorized: grant the client's principal DESCRIBE and WRITE on the topic: %w", topic, err)
}

func missingTopic(topic string, err error) error {
	return fmt.Errorf("kafka: topic %q does not exist: create it (or enable AllowAutoTopicCreation): %w", topic, err)
}

// checkTopics sets the errors of the messages whose topic does not exist,
// with one metadata request for the topics not seen recently. If the
// request fails, the messages are produced anyway and franz-go's own
// metadata handling decides.
func (p *Publisher) checkTopics(ctx context.Context, msgs []*outbox.Message, topics []string, errs []error) {
	now := time.Now()
	var unknown []string
	p.topicsMu.Lock()
	for i, t := range topics {
		if errs[i] != nil {
			continue
		}
		if seen, ok := p.topics[t]; ok && now.Sub(seen) < topicCacheTTL {
			continue
		}
		unknown = append(unknown, t)
	}
	p.topicsMu.Unlock()
	if len(unknown) == 0 {
		return
	}
	req := kmsg.NewPtrMetadataRequest()
	seen := map[string]bool{}
	for _, t := range unknown {
		if seen[t] {
			continue
		}
		seen[t] = true
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		p.opts.Logger.Warn("kafka: topic metadata request failed; producing anyway", "err", err)
		return
	}
	// The errors of a Kafka topic, to be blocked under each message's own
	// topic (several may map to one Kafka topic).
	failed := map[string]error{}
	permanent := map[string]bool{}
	p.topicsMu.Lock()
	for _, rt := range resp.Topics {
		if rt.Topic == nil {
			continue
		}
		t := *rt.Topic
		switch err := kerr.ErrorForCode(rt.ErrorCode); {
		case err == nil:
			p.topics[t] = now
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			failed[t] = missingTopic(t, err)
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			failed[t] = notAuthorized(t, err)
		case errors.Is(err, kerr.InvalidTopicException):
			failed[t] = fmt.Errorf("kafka: topic %q: invalid topic: %w", t, err)
			permanent[t] = true
		}
		// Other errors (a leader election) are transient: produce, and let
		// franz-go wait for the topic to settle.
	}
	p.topicsMu.Unlock()
	for i, t := range topics {
		switch {
		case errs[i] != nil || failed[t] == nil:
		case permanent[t]:
			errs[i] = outbox.Permanent(failed[t])
		default:
			errs[i] = outbox.Blocked(msgs[i].Topic, failed[t])
		}
	}
}

// forgetTopic drops topic from the cache of existing topics. If the topic
// was there (it existed, and is gone: deleted), it also purges the topic
// from franz-go's producer, which otherwise keeps the old topic ID and fails
// every record with UNKNOWN_TOPIC_ID once the topic is created again; the
// next publish checks the topic again and produces under the new ID.
func (p *Publisher) forgetTopic(topic string) {
	p.topicsMu.Lock()
	_, known := p.topics[topic]
	delete(p.topics, topic)
	p.topicsMu.Unlock()
	if known {
		p.opts.Logger.Warn("kafka: topic deleted; it is blocked until it exists again", "topic", topic)
		p.client.PurgeTopicsFromProducing(topic)
	}
}

// purgedText is the text of the (unexported) error franz-go fails the
// records buffered for a topic with when the topic is purged (forgetTopic).
const purgedText = "topic purged while buffered"

// slogLogger adapts an *slog.Logger to kgo.Logger.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case s.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelDebug
	case s.l.Enabled(ctx, slog.LevelInfo):
		return kgo.LogLevelInfo
	case s.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	case s.l.Enabled(ctx, slog.LevelError):
		return kgo.LogLevelError
	}
	return kgo.LogLevelNone
}

func (s slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	case kgo.LogLevelInfo:
		lvl = slog.LevelInfo
	}
	s.l.Log(context.Background(), lvl, "kafka: "+strings.TrimSpace(msg), keyvals...)
}

// unreachable reports whether Dial's ping failed for want of a broker
// answering (refused or timed-out connections), rather than a broker
// refusing the credentials or the TLS handshake.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, context.DeadlineExceeded)
}
