package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish a batch to a stream, including a message whose subject no stream
// covers: that one blocks its topic (the relay pauses the topic, spends no
// attempt and dead-letters nothing, until a stream covers it), and a copy
// of a message already stored, which JetStream reports as a duplicate.
func ExampleDial() {
	srv, stop, err := testenv.StartNATS("") // an embedded NATS server
	if err != nil {
		panic(err)
	}
	defer stop()

	// Streams are created by the application (or `outbox destinations create`), not by
	// the publisher.
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       "ORDERS",
		Subjects:   []string{"outbox.orders.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 10 * time.Minute, // drops copies re-published after a lost ack
	}); err != nil {
		panic(err)
	}

	p, err := natsjs.Dial(srv.ClientURL(), natsjs.Options{SubjectPrefix: "outbox."})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	msgs := []*outbox.Message{
		{ID: outbox.NewID(), Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`)},
		{ID: outbox.NewID(), Topic: "orders.paid", Key: "order-2", Payload: []byte(`{"id":1}`)},
		{ID: outbox.NewID(), Topic: "invoices.sent", Key: "order-3", Payload: []byte(`{"id":1}`)},
	}
	msgs = append(msgs, msgs[0]) // the same ID again
	for i, err := range p.Publish(ctx, msgs) {
		blocked, _ := outbox.IsBlocked(err)
		fmt.Printf("%s: ok=%v duplicate=%v blocked=%q permanent=%v\n",
			msgs[i].Topic, err == nil, errors.Is(err, outbox.ErrDuplicate), blocked, outbox.IsPermanent(err))
	}
	// Output:
	// orders.created: ok=true duplicate=false blocked="" permanent=false
	// orders.paid: ok=true duplicate=false blocked="" permanent=false
	// invoices.sent: ok=false duplicate=false blocked="invoices.sent" permanent=false
	// orders.created: ok=false duplicate=true blocked="" permanent=false
}
