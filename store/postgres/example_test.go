package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// The transactional write: an order and its "orders.created" message
// commit together, or not at all.
func Example() {
	ctx := context.Background()
	dsn := postgres.DatabaseURLForExample() // your postgres:// URL

	store, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil { // usually `outbox migrate`
		log.Fatal(err)
	}
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-1001", 4250); err != nil {
			return err
		}
		return postgres.Write(ctx, tx, outbox.Message{
			Topic:   "orders.created",
			Key:     "o-1001", // messages of one order are published in commit order
			Payload: []byte(`{"id":"o-1001","total_cents":4250}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	// A transaction that rolls back leaves no message behind.
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if err := postgres.Write(ctx, tx, outbox.Message{Topic: "orders.created", Key: "o-1002"}); err != nil {
			return err
		}
		return errors.New("payment declined")
	})
	fmt.Println("second order:", err)

	st, err := store.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("messages waiting for the relay:", st.Outstanding)
	for _, tc := range st.Topics {
		fmt.Printf("  %s: %d\n", tc.Topic, tc.Count)
	}
	// Output:
	// second order: payment declined
	// messages waiting for the relay: 1
	//   orders.created: 1
}
