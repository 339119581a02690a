package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// With retention, a delivered message is marked published, not deleted: it
// is no longer fetched nor unsettled, FindMessages finds it as published,
// and Cleanup deletes it once its retention ended (by the server's clock),
// in batches of at most its limit.
func TestRetentionCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Retention: time.Hour})
	ctx := context.Background()
	var msgs []outbox.Message
	for range 3 {
		msgs = append(msgs, outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"})
	}
	if err := b.write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	p := outbox.PartitionOf("k", testPartitions)
	ls, err := b.store.AcquireLeases(ctx, "n", nil, testPartitions, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var lease outbox.Lease
	for _, l := range ls {
		if l.Partition == p {
			lease = l
		}
	}
	ids := []string{msgs[0].ID, msgs[1].ID, msgs[2].ID}
	if err := b.store.Settle(ctx, "n", []outbox.Settlement{{Lease: lease, Delivered: ids}}); err != nil {
		t.Fatal(err)
	}
	if recs := b.all(t); len(recs) != 0 {
		t.Fatalf("fetched %d published records", len(recs))
	}
	if refs, err := b.store.Unsettled(ctx, []outbox.Cursor{{Lease: lease, After: 1 << 40}}); err != nil || len(refs) != 0 {
		t.Fatalf("Unsettled = %v, %v; want none", refs, err)
	}
	found, err := b.store.FindMessages(ctx, outbox.FindQuery{ID: msgs[0].ID})
	if err != nil || len(found.Messages) != 1 || found.Messages[0].State != outbox.StatePublished || found.Messages[0].PublishedAt.IsZero() {
		t.Fatalf("FindMessages = %+v, %v; want it published", found, err)
	}
	if n, err := b.store.Cleanup(ctx, 10); err != nil || n != 0 {
		t.Fatalf("Cleanup within retention = %d, %v; want 0", n, err)
	}
	if _, err := b.store.DB().ExecContext(ctx, "UPDATE "+b.store.n.messages+" SET published_at = DATE_SUB(published_at, INTERVAL 2 HOUR)"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Cleanup(ctx, 2); err != nil || n != 2 {
		t.Fatalf("Cleanup = %d, %v; want 2", n, err)
	}
	if n, err := b.store.Cleanup(ctx, 2); err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want 1", n, err)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// A closed store refuses every call with outbox.ErrClosed.
func TestClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Partitions(context.Background()); err == nil {
		t.Fatal("Partitions after Close succeeded")
	}
	if err := b.store.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
