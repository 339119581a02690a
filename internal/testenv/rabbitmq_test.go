package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestRabbitMQRestartKeepsDurableMessages checks the shared node: a
// persistent message in a durable queue survives RestartRabbitMQ, and the
// URL stays the same.
func TestRabbitMQRestartKeepsDurableMessages(t *testing.T) {
	u := testenv.RabbitMQ(t)
	if !strings.HasPrefix(u, "amqp://guest:guest@127.0.0.1:") {
		t.Fatalf("RabbitMQ URL = %q; want amqp://guest:guest@127.0.0.1:PORT/", u)
	}
	queue := testenv.Name(t)

	conn, err := amqp.Dial(u)
	check(t, err, "dial")
	ch, err := conn.Channel()
	check(t, err, "channel")
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	check(t, err, "declare quorum queue")
	check(t, ch.Confirm(false), "confirm mode")
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("survives")})
	check(t, err, "publish")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish not confirmed: ack=%v err=%v", ok, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	testenv.RestartRabbitMQ(t)

	// The old connection was closed by the node's shutdown. (A fresh
	// deadline: the restart itself may take longer than ctx allowed.)
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	select {
	case <-closed:
	case <-wait.C:
		t.Fatal("the connection opened before the restart is still open")
	}
	if got := testenv.RabbitMQ(t); got != u {
		t.Fatalf("URL after restart = %q; want %q", got, u)
	}
	conn, err = amqp.Dial(u)
	check(t, err, "dial after restart")
	defer conn.Close()
	ch, err = conn.Channel()
	check(t, err, "channel after restart")
	d, ok, err := ch.Get(queue, true)
	check(t, err, "get")
	if !ok || string(d.Body) != "survives" {
		t.Fatalf("after restart got ok=%v body=%q; want the persistent message", ok, d.Body)
	}
	_, err = ch.QueueDelete(queue, false, false, false)
	check(t, err, "delete queue")
}

// TestStartRabbitMQ starts a second, standalone node and stops it.
func TestStartRabbitMQ(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node, stop, err := testenv.StartRabbitMQ(ctx, testenv.RabbitMQOptions{
		Dir:    t.TempDir(),
		Config: []string{"max_message_size = 1048576"},
		Logf:   t.Logf,
	})
	check(t, err, "StartRabbitMQ")
	conn, err := amqp.Dial(node.URL())
	check(t, err, "dial")
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	check(t, stop(), "stop")
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("connection still open after stop")
	}
	check(t, stop(), "second stop")
	if _, err := amqp.Dial(node.URL()); err == nil {
		t.Fatal("dial succeeded after stop")
	}
}

func TestStartRabbitMQBadSettings(t *testing.T) {
	_, _, err := testenv.StartRabbitMQ(context.Background(), testenv.RabbitMQOptions{
		Config: []string{"listeners.tcp.default = 5672"},
	})
	errorContains(t, err, "listeners.tcp.default", "cannot be set")

	t.Setenv(testenv.RabbitMQServerEnv, "/nonexistent/rabbitmq-server")
	_, _, err = testenv.StartRabbitMQ(context.Background(), testenv.RabbitMQOptions{})
	errorContains(t, err, testenv.RabbitMQServerEnv, "/nonexistent/rabbitmq-server")
}

func TestRabbitMQCtl(t *testing.T) {
	out := testenv.RabbitMQCtl(t, "list_queues", "--quiet", "name")
	if strings.Contains(strings.ToLower(out), "error") {
		t.Fatalf("rabbitmqctl list_queues: %s", out)
	}
}
