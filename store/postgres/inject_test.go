package postgres

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func TestWriteInjectsHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Inject: storetest.Inject})
	traced := storetest.WithTraceparent(b.ctx, "00-trace-span-01")
	own := map[string]string{"h": "v"}
	if err := pgx.BeginFunc(traced, b.store.Pool(), func(tx pgx.Tx) error {
		return b.store.Writer().Write(traced, tx, outbox.Message{Topic: "a", Key: "k", Headers: own})
	}); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(b.store.Pool())
	defer db.Close()
	tx, err := db.BeginTx(traced, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Writer().WriteSQL(traced, tx, outbox.Message{Topic: "a", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := b.write(t, outbox.Message{Topic: "a", Key: "k"}); err != nil { // no trace in ctx
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	if h := recs[0].Headers; h["traceparent"] != "00-trace-span-01" || h["h"] != "v" {
		t.Errorf("Write stored headers %v, want the message's own and the injected traceparent", h)
	}
	if h := recs[1].Headers; h["traceparent"] != "00-trace-span-01" {
		t.Errorf("WriteSQL stored headers %v, want the injected traceparent", h)
	}
	if h := recs[2].Headers; h != nil {
		t.Errorf("a write without a trace stored headers %v, want none", h)
	}
	if len(own) != 1 {
		t.Errorf("Write modified the caller's headers: %v", own)
	}

	// The injected headers are validated like the message's own.
	bad := storetest.WithTraceparent(b.ctx, "line\nbreak")
	err = pgx.BeginFunc(bad, b.store.Pool(), func(tx pgx.Tx) error {
		return b.store.Writer().Write(bad, tx, outbox.Message{Topic: "a"})
	})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Headers" {
		t.Errorf("an injected header with a line break: %v, want a ValidationError on Headers", err)
	}
}
