package rabbitmq_test

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish a batch to the "outbox" topic exchange, including a message whose
// routing key no queue is bound for: the broker returns it, so it blocks its
// topic (the relay pauses the topic, spends no attempt and dead-letters
// nothing, until a queue is bound).
func ExampleDial() {
	url, err := testenv.SharedRabbitMQ() // a RabbitMQ node for the tests
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, err := rabbitmq.Dial(ctx, url, rabbitmq.Options{}) // declares the exchange "outbox"
	if err != nil {
		panic(err)
	}
	defer p.Close()

	// Queues are the consumers' business: bind one for the order topics.
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-queue-type": "classic"})
	if err != nil {
		panic(err)
	}
	if err := ch.QueueBind(q.Name, "orders.#", rabbitmq.ExchangeDefault, false, nil); err != nil {
		panic(err)
	}

	msgs := []*outbox.Message{
		{ID: outbox.NewID(), Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`)},
		{ID: outbox.NewID(), Topic: "orders.paid", Key: "order-2", Payload: []byte(`{"id":1}`)},
		{ID: outbox.NewID(), Topic: "invoices.sent", Key: "order-3", Payload: []byte(`{"id":1}`)},
	}
	for i, err := range p.Publish(ctx, msgs) {
		blocked, _ := outbox.IsBlocked(err)
		fmt.Printf("%s: ok=%v blocked=%q permanent=%v\n", msgs[i].Topic, err == nil, blocked, outbox.IsPermanent(err))
	}
	// Output:
	// orders.created: ok=true blocked="" permanent=false
	// orders.paid: ok=true blocked="" permanent=false
	// invoices.sent: ok=false blocked="invoices.sent" permanent=false
}
