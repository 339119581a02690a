package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// oneKeyPerPartition returns a message for each of p partitions.
func oneKeyPerPartition(p int) []outbox.Message {
	msgs := make([]outbox.Message, p)
	found := 0
	for i := 0; found < p; i++ {
		key := fmt.Sprintf("key-%d", i)
		part := outbox.PartitionOf(key, p)
		if msgs[part].Key == "" {
			msgs[part] = outbox.Message{ID: outbox.NewID(), Topic: "every", Key: key}
			found++
		}
	}
	return msgs
}

// TestWriteToEveryPartitionWakesRelays: a write touching all of 4,096
// partitions names more partitions than a NOTIFY payload can hold (8,000
// bytes). It must commit all the same, and wake the relays with an "any
// partition" notification, which a relay polling once an hour sees.
func TestWriteToEveryPartitionWakesRelays(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: outbox.MaxPartitions})
	listener, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(b.ctx, "LISTEN "+pgx.Identifier{b.opts.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	rec := &relaytest.Recorder{}
	r, err := outbox.NewRelay(b.store, rec, outbox.Config{Node: "n", PollInterval: time.Hour, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	// Once the relay published a first message, every partition is
	// caught up: only a notification makes it fetch again.
	if err := b.write(t, outbox.Message{Topic: "first", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the first message published", time.Minute, func() bool { return len(rec.IDs()) == 1 })
	if n, err := listener.WaitForNotification(b.ctx); err != nil {
		t.Fatal(err)
	} else if want := fmt.Sprint(outbox.PartitionOf("k", outbox.MaxPartitions)); n.Payload != want {
		t.Fatalf("payload %q, want %q", n.Payload, want)
	}

	msgs := oneKeyPerPartition(outbox.MaxPartitions)
	if err := b.write(t, msgs...); err != nil {
		t.Fatalf("a write touching %d partitions: %v", len(msgs), err)
	}
	n, err := listener.WaitForNotification(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != notifyAnyPartition || parsePartitions(n.Payload) != nil {
		t.Fatalf("payload of %d bytes starting %.40q, want %q (any partition)", len(n.Payload), n.Payload, notifyAnyPartition)
	}
	relaytest.WaitFor(t, "the relay woken and publishing", time.Minute, func() bool { return len(rec.IDs()) == 1+len(msgs) })
}
