package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish a batch, including a message whose topic does not exist: that one
// blocks its topic (the relay pauses the topic, spends no attempt and
// dead-letters nothing, until the topic exists).
func ExampleDial() {
	// An in-process Kafka (kfake) with topic "orders.created".
	cluster, stop, err := testenv.StartKafka(testenv.KafkaOptions{Options: []kfake.Opt{kfake.SeedTopics(4, "orders.created")}})
	if err != nil {
		panic(err)
	}
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := kafka.Dial(ctx, kafka.Options{Brokers: cluster.Seeds()})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	msgs := []*outbox.Message{
		{ID: outbox.NewID(), Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`)},
		{ID: outbox.NewID(), Topic: "orders.created", Key: "order-2", Payload: []byte(`{"id":2}`)},
		{ID: outbox.NewID(), Topic: "invoices.sent", Key: "order-1", Payload: []byte(`{"id":1}`)},
	}
	for i, err := range p.Publish(ctx, msgs) {
		blocked, _ := outbox.IsBlocked(err)
		fmt.Printf("%s: ok=%v blocked=%q permanent=%v\n", msgs[i].Topic, err == nil, blocked, outbox.IsPermanent(err))
	}
	// Output:
	// orders.created: ok=true blocked="" permanent=false
	// orders.created: ok=true blocked="" permanent=false
	// invoices.sent: ok=false blocked="invoices.sent" permanent=false
}
