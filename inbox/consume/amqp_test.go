package consume_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/consume"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func dialAMQP(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// declareQueue declares queue on its own connection and deletes it when the
// test ends.
func declareQueue(t *testing.T, url, queue string) {
	t.Helper()
	_, ch := dialAMQP(t, url)
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
		}
	})
}

func receive(t *testing.T, deliveries <-chan amqp.Delivery) *amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return &d
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
	return nil
}

// readyMessages returns the queue's ready message count, read on a fresh
// channel after the consuming channel was closed (which requeues anything
// left unacknowledged).
func readyMessages(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func amqpEffect(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
	return applyEffect(ctx, tx, consume.AMQPMessageID(d))
}

// TestAMQPCrashBetweenCommitAndAck: the handler's transaction commits, then
// the process dies before acknowledging; RabbitMQ requeues the delivery for
// the restarted consumer, and the inbox drops it.
func TestAMQPCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	url := testenv.RabbitMQ(t)
	in, db := newInbox(t)
	ctx := context.Background()
	queue := testenv.Name(t)

	conn1, ch1 := dialAMQP(t, url)
	declareQueue(t, url, queue)
	id := outbox.NewID()
	if err := ch1.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch1.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := consume.AMQP[*sql.Tx]{
		Runner:   crashAfterCommit[*sql.Tx]{inner: in, crash: func() { conn1.Close() }},
		Consumer: queue,
		Handler:  amqpEffect,
	}
	if processed, err := first.Handle(ctx, receive(t, deliveries)); !processed || err == nil {
		t.Fatalf("first delivery: Handle = %v, %v; want true and an ack error (the connection died)", processed, err)
	}

	conn2, ch2 := dialAMQP(t, url)
	deliveries, err = ch2.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, deliveries)
	if !d.Redelivered || d.MessageId != id {
		t.Fatalf("second delivery: Redelivered %v, MessageId %q; want a redelivery of %s", d.Redelivered, d.MessageId, id)
	}
	second := consume.AMQP[*sql.Tx]{Runner: in, Consumer: queue, Handler: amqpEffect}
	if processed, err := second.Handle(ctx, d); processed || err != nil {
		t.Fatalf("redelivery: Handle = %v, %v; want false, nil (duplicate)", processed, err)
	}
	if err := ch2.Close(); err != nil {
		t.Fatal(err)
	}
	if n := readyMessages(t, conn2, queue); n != 0 {
		t.Fatalf("%d messages back in the queue; want 0 (the duplicate was acknowledged)", n)
	}
	if got := effectCount(t, db, id); got != 1 {
		t.Fatalf("effect applied %d times; want 1", got)
	}
}

// TestAMQPFailureAndMissingID: a failed handler's delivery is requeued and
// handled again; a delivery without an ID is rejected without requeueing.
func TestAMQPFailureAndMissingID(t *testing.T) {
	t.Parallel()
	url := testenv.RabbitMQ(t)
	in, db := newInbox(t)
	ctx := context.Background()
	queue := testenv.Name(t)
	conn, ch := dialAMQP(t, url)
	declareQueue(t, url, queue)
	id := outbox.NewID()
	// The ID in the Outbox-Id header only, as a foreign publisher might send it.
	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Headers: amqp.Table{outbox.HeaderID: id}}); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := consume.AMQP[*sql.Tx]{
		Runner:   in,
		Consumer: queue,
		Handler: func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			calls++
			if err := amqpEffect(ctx, tx, d); err != nil {
				return err
			}
			if calls == 1 {
				return errors.New("transient failure")
			}
			return nil
		},
	}
	boom := 0
	var noID, handled int
	for boom+noID+handled < 3 {
		processed, err := h.Handle(ctx, receive(t, deliveries))
		switch {
		case errors.Is(err, inbox.ErrNoMessageID):
			noID++
		case err != nil && err.Error() == "transient failure":
			boom++
		case err == nil && processed:
			handled++
		default:
			t.Fatalf("Handle = %v, %v", processed, err)
		}
	}
	if boom != 1 || noID != 1 || handled != 1 || calls != 2 {
		t.Fatalf("outcomes: %d failed, %d without ID, %d handled, %d handler calls; want 1, 1, 1, 2", boom, noID, handled, calls)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if n := readyMessages(t, conn, queue); n != 0 {
		t.Fatalf("%d messages left in the queue; want 0", n)
	}
	if got := effectCount(t, db, id); got != 1 {
		t.Fatalf("effect applied %d times; want 1", got)
	}
}
