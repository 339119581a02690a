package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// writerTopics are the topics the writers use (one per writer).
func writerTopics() []string {
	var topics []string
	for i := 0; i < 5; i++ {
		topics = append(topics, fmt.Sprintf("e2e.w%d", i))
	}
	return topics
}

// rabbitTarget: the test's own topic exchange on the shared RabbitMQ node,
// with a durable queue bound to "e2e.#", read back in queue order (one
// queue: arrival order, which is per-key publish order).
func rabbitTarget(t *testing.T) *target {
	base := testenv.RabbitMQ(t)
	name := testenv.Name(t)
	conn, err := amqp.Dial(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "e2e.#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return &target{name: "rabbitmq", url: base + sep + "exchange=" + name, read: rabbitQueueReader(ch, name)}
}

// kafkaTarget: a kfake cluster with the writers' topics (4 partitions
// each), read back from the start; one key stays in one partition, whose
// order is the per-key publish order.
func kafkaTarget(t *testing.T) *target {
	seeds, _ := testenv.Kafka(t, kfake.SeedTopics(4, writerTopics()...))
	return &target{name: "kafka", url: "kafka://" + strings.Join(seeds, ","), read: kafkaReader(seeds, writerTopics())}
}

// kafkaReader reads topics from the start until every written message has
// been delivered (the checker reports any that never come as lost).
func kafkaReader(seeds, topics []string) func(t *testing.T, c *brokertest.Checker) int {
	return func(t *testing.T, c *brokertest.Checker) int {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topics...),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		got := 0
		for rep := c.Verify(); rep.DeliveredUnique < rep.Written; rep = c.Verify() {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				break
			}
			fetches.EachError(func(topic string, p int32, err error) { t.Errorf("fetch %s/%d: %v", topic, p, err) })
			fetches.EachRecord(func(r *kgo.Record) {
				var id string
				for _, h := range r.Headers {
					if h.Key == outbox.HeaderID {
						id = string(h.Value)
					}
				}
				c.Delivered(brokertest.Received{ID: id, Key: string(r.Key), Topic: r.Topic})
				got++
			})
		}
		return got
	}
}
