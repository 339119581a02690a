package dynamodb_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/dynamodb"
)

// exampleEndpoint starts one dynalite for the examples (stopped by
// testenv.Main).
var exampleEndpoint = sync.OnceValues(func() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	endpoint, _, err := testenv.StartDynalite(ctx, testenv.DynaliteOptions{})
	return endpoint, err
})

// Dispatching the ADR's way: list outstanding messages of every topic,
// read them in one batch, mark them dispatched.
func ExampleStore_Outstanding() {
	ctx := context.Background()
	endpoint, err := exampleEndpoint()
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamodb.Open(ctx, "dynamodb://example_outstanding?region=us-east-1&shards=20&endpoint="+endpoint)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer store.DropTable(ctx)

	for i, topic := range []string{"orders.created", "users.created"} {
		msg := outbox.Message{Topic: topic, Key: fmt.Sprint("key-", i), Payload: []byte("hello")}
		if err := store.Write(ctx, &msg); err != nil {
			log.Fatal(err)
		}
	}
	entries, err := store.Outstanding(ctx, dynamodb.Query{})
	if err != nil {
		log.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.ID)
	}
	msgs, err := store.GetMany(ctx, ids)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Println(m.Topic, string(m.Payload))
		if err := store.MarkDispatched(ctx, m.ID, time.Now()); err != nil {
			log.Fatal(err)
		}
	}
	n, err := store.OutstandingCount(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("outstanding:", n)
	// Output:
	// orders.created hello
	// users.created hello
	// outstanding: 0
}
