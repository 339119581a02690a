package backends

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/redact"
)

// DestinationSpec is what [CreateDestinations] creates on a broker for the
// outbox topics Topics (each with the broker's subject prefix before it,
// as the relay publishes them). The zero value of a field means the
// default it documents.
type DestinationSpec struct {
	Topics []string
	// TopicsFlag names the setting that gave Topics, for errors (default
	// --topic; the relay's is --create-destinations).
	TopicsFlag string

	// NATS JetStream: one stream named Stream (default "OUTBOX") whose
	// subjects are Subjects (default: the topics, with the prefix), with
	// Retention "limits" (default), "interest" or "workqueue", Replicas
	// (default 1), a duplicate window (default 2m: the relay's Nats-Msg-Id
	// deduplication only works within it), Storage "file" (default) or
	// "memory", and MaxAge (0: keep until the limits).
	Stream          string
	Subjects        []string
	Retention       string
	Replicas        int
	DuplicateWindow time.Duration
	Storage         string
	MaxAge          time.Duration

	// Kafka: one topic per outbox topic with Partitions and
	// ReplicationFactor (0: the brokers' defaults).
	Partitions        int
	ReplicationFactor int

	// RabbitMQ: the URL's exchange (declared as the relay declares it), a
	// durable queue Queue (default: the exchange's name) of QueueType
	// "classic" (default) or "quorum", bound to the exchange with each
	// topic (with the prefix) as binding key; a topic may use AMQP
	// wildcards (orders.#).
	Queue     string
	QueueType string
}

// DestinationResult is one thing CreateDestinations created or found.
type DestinationResult struct {
	Kind   string `json:"kind"` // "stream", "topic", "exchange", "queue", "binding"
	Name   string `json:"name"`
	Action string `json:"action"` // "created", "exists", "updated", "declared" (AMQP: created or found)
	Detail string `json:"settings,omitempty"`
}

// Defaults of DestinationSpec.
const (
	DestinationStreamDefault          = "OUTBOX"
	DestinationDuplicateWindowDefault = 2 * time.Minute
)

// CreateDestinations creates on the broker named by rawURL (as for
// [OpenPublisher], with the same options) what the relay publishes spec's
// topics to, leaving what exists as it is (a NATS stream gets the subjects
// it lacks added). Mistakes in spec are *ConfigError.
func CreateDestinations(ctx context.Context, rawURL string, o BrokerOptions, spec DestinationSpec) ([]DestinationResult, error) {
	u, o, _, err := preparePublisher(rawURL, o)
	if err != nil {
		return nil, err
	}
	if spec.TopicsFlag == "" {
		spec.TopicsFlag = "--topic"
	}
	for _, t := range spec.Topics {
		if err := outbox.ValidateTopic(strings.NewReplacer("*", "x", ">", "x", "#", "x").Replace(t)); err != nil {
			return nil, Invalid(spec.TopicsFlag, "%q: %v", t, err)
		}
	}
	prefixed := make([]string, len(spec.Topics))
	for i, t := range spec.Topics {
		prefixed[i] = o.SubjectPrefix + t
	}
	switch u.Scheme {
	case "nats", "tls":
		return createNATS(ctx, u, o, spec, prefixed)
	case "kafka":
		return createKafka(ctx, u, o, spec, prefixed)
	case "amqp", "amqps":
		return createRabbitMQ(ctx, u, o, spec, prefixed)
	}
	return nil, Invalid(BrokerFlag, "outbox destinations create knows nats://, tls://, kafka://, amqp:// and amqps:// brokers, not %s://", u.Scheme)
}

func createNATS(ctx context.Context, u *url.URL, o BrokerOptions, spec DestinationSpec, topics []string) ([]DestinationResult, error) {
	cfg := jetstream.StreamConfig{
		Name:       spec.Stream,
		Subjects:   spec.Subjects,
		Replicas:   spec.Replicas,
		Duplicates: spec.DuplicateWindow,
		MaxAge:     spec.MaxAge,
	}
	if cfg.Name == "" {
		cfg.Name = DestinationStreamDefault
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = topics
	}
	if len(cfg.Subjects) == 0 {
		return nil, Invalid(spec.TopicsFlag, "give the topics (or --stream-subjects) the stream must cover, such as %s 'orders.>'", spec.TopicsFlag)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = DestinationDuplicateWindowDefault
	}
	switch spec.Retention {
	case "", "limits":
		cfg.Retention = jetstream.LimitsPolicy
	case "interest":
		cfg.Retention = jetstream.InterestPolicy
	case "workqueue":
		cfg.Retention = jetstream.WorkQueuePolicy
	default:
		return nil, Invalid("--stream-retention", "must be limits, interest or workqueue, got %q", spec.Retention)
	}
	switch spec.Storage {
	case "", "file":
		cfg.Storage = jetstream.FileStorage
	case "memory":
		cfg.Storage = jetstream.MemoryStorage
	default:
		return nil, Invalid("--stream-storage", "must be file or memory, got %q", spec.Storage)
	}
	opts, err := natsOptions(o)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(u.String(), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(u.String()), natsRefusal(err, u, o))
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
		return []DestinationResult{{Kind: "stream", Name: cfg.Name, Action: "created", Detail: natsDetail(cfg)}}, nil
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	have := s.CachedInfo().Config
	var missing []string
	for _, subj := range cfg.Subjects {
		if !slices.Contains(have.Subjects, subj) {
			missing = append(missing, subj)
		}
	}
	if len(missing) == 0 {
		return []DestinationResult{{Kind: "stream", Name: cfg.Name, Action: "exists", Detail: natsDetail(have)}}, nil
	}
	have.Subjects = append(have.Subjects, missing...)
	if _, err := js.UpdateStream(ctx, have); err != nil {
		return nil, fmt.Errorf("add subjects %s to stream %s: %w", strings.Join(missing, ", "), cfg.Name, err)
	}
	return []DestinationResult{{Kind: "stream", Name: cfg.Name, Action: "updated", Detail: "added subjects " + strings.Join(missing, ", ") + "; " + natsDetail(have)}}, nil
}

func natsDetail(c jetstream.StreamConfig) string {
	return fmt.Sprintf("subjects %s, retention %s, replicas %d, duplicate window %v, storage %s, max age %v",
		strings.Join(c.Subjects, " "), c.Retention, c.Replicas, c.Duplicates, c.Storage, c.MaxAge)
}

func createKafka(ctx context.Context, u *url.URL, o BrokerOptions, spec DestinationSpec, topics []string) ([]DestinationResult, error) {
	if len(topics) == 0 {
		return nil, Invalid(spec.TopicsFlag, "give the topics to create, such as %s orders.created", spec.TopicsFlag)
	}
	if spec.Partitions < 0 || spec.ReplicationFactor < 0 {
		return nil, Invalid("--kafka-partitions", "and --kafka-replication-factor must not be negative (0: the brokers' defaults)")
	}
	kopts, err := kafka.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	copts := []kgo.Opt{kgo.SeedBrokers(kopts.Brokers...)}
	tlsCfg, err := o.TLS.Config()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		copts = append(copts, kgo.DialTLSConfig(tlsCfg))
	}
	if m := kafkaSASL(o.Kafka); m != nil {
		copts = append(copts, kgo.SASL(m))
	}
	cl, err := kgo.NewClient(copts...)
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	defer cl.Close()
	partitions, rf := int32(spec.Partitions), int16(spec.ReplicationFactor)
	if partitions == 0 {
		partitions = -1
	}
	if rf == 0 {
		rf = -1
	}
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, rf, nil, topics...)
	if err != nil {
		return nil, kafkaRefusal(err, o)
	}
	var out []DestinationResult
	for _, t := range topics {
		r := resp[t]
		detail := fmt.Sprintf("partitions %d, replication factor %d", r.NumPartitions, r.ReplicationFactor)
		switch {
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			out = append(out, DestinationResult{Kind: "topic", Name: t, Action: "exists"})
		case r.Err != nil:
			return out, fmt.Errorf("create topic %s: %w", t, r.Err)
		default:
			out = append(out, DestinationResult{Kind: "topic", Name: t, Action: "created", Detail: detail})
		}
	}
	return out, nil
}

func createRabbitMQ(ctx context.Context, u *url.URL, o BrokerOptions, spec DestinationSpec, topics []string) ([]DestinationResult, error) {
	if len(topics) == 0 {
		return nil, Invalid(spec.TopicsFlag, "give the topics the queue must receive (binding keys), such as %s 'orders.#'", spec.TopicsFlag)
	}
	amqpURL, ropts, err := rabbitmq.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	ropts = ropts.WithDefaults()
	queueType := spec.QueueType
	switch queueType {
	case "":
		queueType = "classic"
	case "classic", "quorum":
	default:
		return nil, Invalid("--queue-type", "must be classic or quorum, got %q", spec.QueueType)
	}
	if amqpURL, err = amqpURLWithPassword(amqpURL, o); err != nil {
		return nil, err
	}
	cfg := amqp.Config{Dial: amqp.DefaultDial(30 * time.Second)}
	if cfg.TLSClientConfig, err = o.TLS.Config(); err != nil {
		return nil, err
	}
	conn, err := amqp.DialConfig(amqpURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(u.String()), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	// Declared as the publisher declares it (a durable topic exchange).
	if err := ch.ExchangeDeclare(ropts.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange %s: %w", ropts.Exchange, err)
	}
	out := []DestinationResult{{Kind: "exchange", Name: ropts.Exchange, Action: "declared", Detail: "topic, durable"}}
	queue := spec.Queue
	if queue == "" {
		queue = ropts.Exchange
	}
	q, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": queueType})
	if err != nil {
		return out, fmt.Errorf("declare queue %s (%s): %w (a queue of that name with other settings exists: give another --queue)", queue, queueType, err)
	}
	out = append(out, DestinationResult{Kind: "queue", Name: queue, Action: "declared", Detail: fmt.Sprintf("%s, durable, %d messages", queueType, q.Messages)})
	for _, t := range topics {
		if err := ch.QueueBind(queue, t, ropts.Exchange, false, nil); err != nil {
			return out, fmt.Errorf("bind queue %s to exchange %s with key %s: %w", queue, ropts.Exchange, t, err)
		}
		out = append(out, DestinationResult{Kind: "binding", Name: ropts.Exchange + " → " + queue, Action: "declared", Detail: "key " + t})
	}
	return out, ctx.Err()
}
