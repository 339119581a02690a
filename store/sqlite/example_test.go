package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// Write an order and its event in one transaction: the event exists if and
// only if the order does.
func ExampleStore_Write() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	s, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)"); err != nil {
		log.Fatal(err)
	}

	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES (?, ?)", "o-1", 4200); err != nil {
		log.Fatal(err)
	}
	err = s.Write(ctx, tx, outbox.Message{
		Topic:   "orders.created",
		Key:     "customer-7",
		Payload: []byte(`{"order":"o-1","total":4200}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The relay's side: what is waiting in the customer's partition.
	p, err := s.Partitions(ctx)
	if err != nil {
		log.Fatal(err)
	}
	cursor := outbox.Cursor{Lease: outbox.Lease{Partition: outbox.PartitionOf("customer-7", p)}}
	recs, err := s.Fetch(ctx, []outbox.Cursor{cursor}, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Printf("%s %s %s\n", r.Topic, r.Key, r.Payload)
	}
	// Output:
	// orders.created customer-7 {"order":"o-1","total":4200}
}
