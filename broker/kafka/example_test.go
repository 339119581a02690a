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
// fails permanently, and the relay dead-letters it.
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
		fmt.Printf("%s: ok=%v permanent=%v\n", msgs[i].Topic, err == nil, outbox.IsPermanent(err))
	}
	// Output:
	// orders.created: ok=true permanent=false
	// orders.created: ok=true permanent=false
	// invoices.sent: ok=false permanent=true
}
