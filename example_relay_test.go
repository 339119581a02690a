package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// The relay end to end on the embedded default: messages written in the
// application's transaction reach a JetStream stream, in order per key.
func ExampleRelay() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)

	// The application's database, with the outbox tables.
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	// A broker: an embedded NATS server with a stream for "orders.>".
	srv, stopNATS, err := testenv.StartNATS("")
	if err != nil {
		panic(err)
	}
	defer stopNATS()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		panic(err)
	}

	// The business write and its messages commit together.
	tx, _ := store.DB().BeginTx(ctx, nil)
	err = store.Write(ctx, tx,
		outbox.Message{Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`)},
		outbox.Message{Topic: "orders.paid", Key: "order-1", Payload: []byte(`{"id":1}`)},
	)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	// The relay drains the outbox to the broker.
	pub, err := natsjs.Dial(srv.ClientURL(), natsjs.Options{})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(store, pub, outbox.Config{PollInterval: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := relay.Start(ctx); err != nil {
		panic(err)
	}
	for relay.Stats().Published < 2 {
		time.Sleep(10 * time.Millisecond) // waiting for the example's output
	}
	if err := relay.Stop(); err != nil {
		panic(err)
	}

	cons, _ := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	batch, _ := cons.Fetch(2)
	for m := range batch.Messages() {
		fmt.Println(m.Subject(), m.Headers().Get(outbox.HeaderKey), string(m.Data()))
	}
	// Output:
	// orders.created order-1 {"id":1}
	// orders.paid order-1 {"id":1}
}
