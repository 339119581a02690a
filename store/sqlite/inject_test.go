package sqlite

import (
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func TestWriteInjectsHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Inject: storetest.Inject})
	traced := storetest.WithTraceparent(b.ctx, "00-trace-span-01")
	own := map[string]string{"h": "v"}
	tx, err := b.store.DB().BeginTx(traced, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Write(traced, tx, outbox.Message{Topic: "a", Key: "k", Headers: own}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := b.write(t, outbox.Message{Topic: "a", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	if h := recs[0].Headers; h["traceparent"] != "00-trace-span-01" || h["h"] != "v" {
		t.Errorf("Write stored headers %v, want the message's own and the injected traceparent", h)
	}
	if h := recs[1].Headers; h != nil {
		t.Errorf("a write without a trace stored headers %v, want none", h)
	}
	if len(own) != 1 {
		t.Errorf("Write modified the caller's headers: %v", own)
	}
}
