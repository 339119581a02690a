package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// With polls an hour apart, only notifications make a caught-up relay
// fetch: one message after another, each to its own partition, each of
// them is published. (A worker whose partitions are all caught up skips
// its refill until something changes: a notification must count as such
// a change for every worker it names, however many times the loop ran in
// between.)
func TestNotifiedWritesArePublishedWithoutPolls(t *testing.T) {
	st := memstore.New(16, nil)
	rec := &relaytest.Recorder{}
	r := relaytest.Start(t, st, rec, outbox.Config{Workers: 4, PollInterval: time.Hour, SweepInterval: time.Hour})
	defer func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	}()
	for i := range 40 {
		m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprintf("k%d", i)}
		if err := st.Write(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		relaytest.WaitFor(t, fmt.Sprintf("message %d published", i+1), 20*time.Second, func() bool { return len(rec.IDs()) == i+1 })
	}
}
