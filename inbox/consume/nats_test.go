package consume_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/consume"
	"github.com/outboxrelay/outbox/internal/testenv"
)

type natsEnv struct {
	url string
	js  jetstream.JetStream
}

func setupNATS(t *testing.T) natsEnv {
	t.Helper()
	s := testenv.NATS(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	return natsEnv{url: s.ClientURL(), js: js}
}

func connectJS(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func fetchOne(t *testing.T, c jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		return msg
	}
	t.Fatalf("no message within 20s (fetch error: %v)", batch.Error())
	return nil
}

func countEffect(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
	return applyEffect(ctx, tx, consume.NATSMessageID(msg))
}

// TestNATSCrashBetweenCommitAndAck: the handler's transaction commits, then
// the process dies before acknowledging. JetStream redelivers after AckWait
// to the restarted consumer, and the inbox drops the redelivery.
func TestNATSCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	env := setupNATS(t)
	in, db := newInbox(t)
	ctx := context.Background()
	id := outbox.NewID()
	if _, err := env.js.Publish(ctx, "orders.created", []byte("{}"), jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 300 * time.Millisecond}
	if _, err := env.js.CreateOrUpdateConsumer(ctx, "ORDERS", cfg); err != nil {
		t.Fatal(err)
	}

	// The first process: commits, then dies (its connection closes) before the ack.
	nc1, js1 := connectJS(t, env.url)
	c1, err := js1.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		t.Fatal(err)
	}
	first := consume.NATS[*sql.Tx]{
		Runner:   crashAfterCommit[*sql.Tx]{inner: in, crash: nc1.Close},
		Consumer: "billing",
		Handler:  countEffect,
	}
	processed, err := first.Handle(ctx, fetchOne(t, c1))
	if !processed || err == nil {
		t.Fatalf("first delivery: Handle = %v, %v; want true and an ack error (the connection died)", processed, err)
	}
	if got := effectCount(t, db, id); got != 1 {
		t.Fatalf("effect applied %d times after the first delivery; want 1", got)
	}

	// The restarted process gets the redelivery after AckWait and drops it.
	_, js2 := connectJS(t, env.url)
	c2, err := js2.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		t.Fatal(err)
	}
	msg := fetchOne(t, c2)
	if md, err := msg.Metadata(); err != nil || md.NumDelivered != 2 {
		t.Fatalf("redelivery metadata = %+v, %v; want NumDelivered 2", md, err)
	}
	second := consume.NATS[*sql.Tx]{Runner: in, Consumer: "billing", Handler: countEffect}
	if processed, err := second.Handle(ctx, msg); processed || err != nil {
		t.Fatalf("redelivery: Handle = %v, %v; want false, nil (duplicate)", processed, err)
	}
	eventually(t, "the redelivery to be acknowledged", func() bool {
		info, err := c2.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if got := effectCount(t, db, id); got != 1 {
		t.Fatalf("effect applied %d times; want 1", got)
	}
}

// TestNATSConsume runs the helper under Consumer.Consume with duplicates (the
// same outbox ID published twice past JetStream's own deduplication), a
// handler that fails once, and a message without an ID.
func TestNATSConsume(t *testing.T) {
	t.Parallel()
	env := setupNATS(t)
	in, db := newInbox(t)
	ctx := context.Background()

	const messages = 50
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = outbox.NewID()
		for range 2 {
			// Outbox-Id only: JetStream does not drop the second copy.
			m := &nats.Msg{Subject: "orders.created", Data: []byte(ids[i]), Header: nats.Header{outbox.HeaderID: []string{ids[i]}}}
			if _, err := env.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := env.js.Publish(ctx, "orders.created", []byte("no id")); err != nil {
		t.Fatal(err)
	}
	c, err := env.js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var errs []error
	failOnce := ids[7]
	failed := false
	h := consume.NATS[*sql.Tx]{
		Runner:   in,
		Consumer: "billing",
		Handler: func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
			id := consume.NATSMessageID(msg)
			mu.Lock()
			fail := id == failOnce && !failed
			failed = failed || fail
			mu.Unlock()
			if err := applyEffect(ctx, tx, id); err != nil {
				return err
			}
			if fail {
				return errors.New("transient failure")
			}
			return nil
		},
	}
	cc, err := c.Consume(h.MessageHandler(ctx, func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	eventually(t, "every message to be handled and acknowledged", func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.Delivered.Consumer >= 2*messages+2
	})
	cc.Stop()
	if rows, maxN := effectTotals(t, db); rows != messages || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want %d rows applied once each", rows, maxN, messages)
	}
	mu.Lock()
	defer mu.Unlock()
	var noID, transient int
	for _, err := range errs {
		switch {
		case errors.Is(err, inbox.ErrNoMessageID):
			noID++
		case fmt.Sprint(err) == "transient failure":
			transient++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if noID != 1 || transient != 1 {
		t.Fatalf("errors: %d without ID, %d transient (%v); want 1 and 1", noID, transient, errs)
	}
}

func TestNATSConfigErrors(t *testing.T) {
	t.Parallel()
	in, _ := newInbox(t)
	h := consume.NATS[*sql.Tx]{Runner: in, Handler: countEffect}
	if _, err := h.Handle(context.Background(), nil); err == nil || !errorsContain(err, "NATS.Consumer") {
		t.Fatalf("Handle without Consumer: err = %v; want an error naming NATS.Consumer", err)
	}
	h = consume.NATS[*sql.Tx]{Consumer: "c", Handler: countEffect}
	if _, err := h.Handle(context.Background(), nil); err == nil || !errorsContain(err, "NATS.Runner") {
		t.Fatalf("Handle without Runner: err = %v", err)
	}
}

func errorsContain(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}
