package postgres

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// TestFindPublished: with retention, FindMessages finds published messages
// by ID and, within the window of the most recently published, by key.
func TestFindPublished(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Retention: time.Hour})
	msgs := []outbox.Message{{ID: outbox.NewID(), Topic: "r", Key: "k"}, {ID: outbox.NewID(), Topic: "r", Key: "k"}, {ID: outbox.NewID(), Topic: "r", Key: "other"}}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	lease := b.ownedLease(t, "n", "k")
	if err := b.store.Settle(b.ctx, "n", []outbox.Settlement{{Lease: lease, Delivered: []string{msgs[0].ID}}}); err != nil {
		t.Fatal(err)
	}
	r, err := b.store.FindMessages(b.ctx, outbox.FindQuery{ID: msgs[0].ID})
	if err != nil || len(r.Messages) != 1 || r.Messages[0].State != outbox.StatePublished || r.Messages[0].PublishedAt.IsZero() {
		t.Fatalf("FindMessages(published ID) = %+v, %v; want one published message with its time", r, err)
	}
	r, err = b.store.FindMessages(b.ctx, outbox.FindQuery{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]outbox.MessageState{}
	for _, m := range r.Messages {
		states[m.ID] = m.State
	}
	if len(states) != 2 || states[msgs[0].ID] != outbox.StatePublished || states[msgs[1].ID] != outbox.StateOutstanding || len(r.Unsearched) != 0 {
		t.Errorf("FindMessages(key k) = %+v, want %s published and %s outstanding, all searched", r, msgs[0].ID, msgs[1].ID)
	}
}
