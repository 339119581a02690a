package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/backends"
)

// kafkaPartitions is the partition count of the bench's topics.
const kafkaPartitions = 16

// openKafka opens Kafka through backends.OpenPublisher with a topic prefix
// of the bench's own. Every Reset creates a new topic (16 partitions,
// the cluster's replication factor) under a new prefix and deletes the
// previous one, so that each run starts empty; Stored sums the topic's
// high watermarks. Close deletes the last topic.
func openKafka(ctx context.Context, rawURL string) (*Broker, error) {
	rawURL = withoutParams(rawURL, "prefix")
	opts, err := kafka.ParseURL(withoutParams(rawURL, "ack_timeout", "max_in_flight"))
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "%v", err)
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(opts.Brokers...))
	if err != nil {
		return nil, fmt.Errorf("bench: kafka admin client: %w", err)
	}
	b := &kafkaBench{admin: admin, base: "outbox_bench_" + randomHex(4)}
	if err := b.next(ctx); err != nil {
		admin.Close()
		return nil, err
	}
	return &Broker{
		Name:   fmt.Sprintf("kafka (%s, %d partitions, acks=all)", strings.Join(opts.Brokers, ","), kafkaPartitions),
		url:    rawURL,
		prefix: b.prefix,
		reset:  b.next,
		count:  b.count,
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = b.drop(ctx, b.topic()) // best effort
			admin.Close()
		},
	}, nil
}

type kafkaBench struct {
	admin *kgo.Client
	base  string

	mu  sync.Mutex
	run int
}

func (b *kafkaBench) prefix() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.base + "_" + strconv.Itoa(b.run) + "."
}

func (b *kafkaBench) topic() string { return b.prefix() + Topic }

// next deletes the current topic (if any) and creates the next one.
func (b *kafkaBench) next(ctx context.Context) error {
	b.mu.Lock()
	old := b.run
	b.run++
	b.mu.Unlock()
	if old > 0 {
		if err := b.drop(ctx, b.base+"_"+strconv.Itoa(old)+"."+Topic); err != nil {
			return err
		}
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic = b.topic()
	t.NumPartitions = kafkaPartitions
	t.ReplicationFactor = -1
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, b.admin)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("bench: create kafka topic %s: %w", t.Topic, err)
	}
	return nil
}

func (b *kafkaBench) drop(ctx context.Context, topic string) error {
	req := kmsg.NewPtrDeleteTopicsRequest()
	name := topic
	t := kmsg.NewDeleteTopicsRequestTopic()
	t.Topic = &name
	req.Topics = append(req.Topics, t)
	req.TopicNames = append(req.TopicNames, topic)
	resp, err := req.RequestWith(ctx, b.admin)
	if err == nil && len(resp.Topics) == 1 {
		if e := kerr.ErrorForCode(resp.Topics[0].ErrorCode); e != nil && e != kerr.UnknownTopicOrPartition {
			err = e
		}
	}
	if err != nil {
		return fmt.Errorf("bench: delete kafka topic %s: %w", topic, err)
	}
	return nil
}

// count sums the high watermarks of the current topic's partitions.
func (b *kafkaBench) count(ctx context.Context) (int64, error) {
	topic := b.topic()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(kafkaPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = -1 // the high watermark
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, b.admin)
	if err != nil {
		return 0, fmt.Errorf("bench: list offsets of %s: %w", topic, err)
	}
	var n int64
	seen := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return 0, fmt.Errorf("bench: list offsets of %s[%d]: %w", topic, p.Partition, err)
			}
			n += p.Offset
			seen++
		}
	}
	if seen != kafkaPartitions {
		return 0, fmt.Errorf("bench: list offsets of %s: got %d of %d partitions", topic, seen, kafkaPartitions)
	}
	return n, nil
}
