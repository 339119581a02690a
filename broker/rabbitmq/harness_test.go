package rabbitmq_test

import (
	"context"
	"fmt"

	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// readTimeout bounds each Read of the harness.
const readTimeout = 30 * time.Second

// testMaxMessageSize is the MaxMessageSize of the publishers under test.
const testMaxMessageSize = 1 << 20

// dial returns a publisher for the shared node, closed by t.Cleanup.
func dial(t testing.TB, opts rabbitmq.Options) *rabbitmq.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := rabbitmq.Dial(ctx, testenv.RabbitMQ(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// admin opens a connection and channel for setting up queues, closed by
// t.Cleanup.
func admin(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(testenv.RabbitMQ(t))
	if err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("admin channel: %v", err)
	}
	return ch
}

// queueFor declares a durable queue of the given type ("classic" or
// "quorum") named after the test, bound to exchange with routingKey, and
// returns its name. It is deleted by t.Cleanup.
func queueFor(t testing.TB, queueType, exchange, routingKey string, args amqp.Table) string {
	t.Helper()
	ch := admin(t)
	name := testenv.Name(t)
	if args == nil {
		args = amqp.Table{}
	}
	args["x-queue-type"] = queueType
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s queue %s: %v", queueType, name, err)
	}
	if err := ch.QueueBind(name, routingKey, exchange, false, nil); err != nil {
		t.Fatalf("bind queue %s to %s with %q: %v", name, exchange, routingKey, err)
	}
	t.Cleanup(func() {
		// The admin connection may have been closed by a restart: use a
		// fresh one.
		conn, err := amqp.Dial(testenv.RabbitMQ(t))
		if err != nil {
			t.Errorf("delete queue %s: %v", name, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(name, false, false, false)
		}
		if err != nil {
			t.Errorf("delete queue %s: %v", name, err)
		}
	})
	return name
}

// read consumes the next n messages of queue, acknowledging them, in
// delivery order. It fails the test after readTimeout.
func read(t testing.TB, queue string, n int) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(testenv.RabbitMQ(t))
	if err != nil {
		t.Fatalf("read %s: %v", queue, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("read %s: %v", queue, err)
	}
	// The broker sends no more than n unacknowledged messages: nothing is
	// taken from the queue beyond what is asked for.
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatalf("read %s: qos: %v", queue, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("read %s: consume: %v", queue, err)
	}
	var got []amqp.Delivery
	for len(got) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("read %s: consumer closed after %d of %d messages", queue, len(got), n)
			}
			got = append(got, d)
		case <-ctx.Done():
			t.Fatalf("read %s: got %d of %d messages within %v", queue, len(got), n, readTimeout)
		}
	}
	if err := got[len(got)-1].Ack(true); err != nil {
		t.Fatalf("read %s: ack: %v", queue, err)
	}
	// Closing the channel waits for the broker's close-ok, which it sends
	// after processing the ack.
	if err := ch.Close(); err != nil {
		t.Fatalf("read %s: close channel: %v", queue, err)
	}
	return got
}

// received converts a delivery to what the conformance suite compares.
func received(t testing.TB, d amqp.Delivery) brokertest.Received {
	t.Helper()
	r := brokertest.Received{
		ID:      d.MessageId,
		Topic:   d.Type,
		Payload: d.Body,
		Headers: map[string]string{},
	}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			// The broker's own, such as x-delivery-count of quorum queues.
			if !strings.HasPrefix(k, "x-") {
				t.Fatalf("message %s: header %q has type %T; want string", d.MessageId, k, v)
			}
			s = fmt.Sprint(v)
		}
		r.Headers[k] = s
	}
	r.Key = r.Headers[outbox.HeaderKey]
	if id := r.Headers[outbox.HeaderID]; id != d.MessageId {
		t.Fatalf("message-id %q but %s header %q", d.MessageId, outbox.HeaderID, id)
	}
	if s, ok := r.Headers[outbox.HeaderCreatedAt]; ok {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("message %s: %s header: %v", d.MessageId, outbox.HeaderCreatedAt, err)
		}
		r.CreatedAt = at
	}
	return r
}

// harness returns the conformance harness for queues of queueType.
func harness(queueType string) func(t *testing.T) brokertest.Harness {
	return func(t *testing.T) brokertest.Harness {
		p := dial(t, rabbitmq.Options{MaxMessageSize: testMaxMessageSize})
		queues := map[string]string{} // topic → queue; Topic and Read run on the test's goroutine
		return brokertest.Harness{
			Publisher: p,
			Topic: func(t *testing.T) string {
				topic := "rmq." + testenv.Name(t)
				queues[topic] = queueFor(t, queueType, rabbitmq.ExchangeDefault, topic, nil)
				return topic
			},
			MissingTopic: func(t *testing.T) string { return "rmq.unbound." + testenv.Name(t) },
			Read: func(t *testing.T, topic string, n int) []brokertest.Received {
				q, ok := queues[topic]
				if !ok {
					t.Fatalf("Read of unknown topic %q", topic)
				}
				var out []brokertest.Received
				for _, d := range read(t, q, n) {
					r := received(t, d)
					if d.RoutingKey != topic {
						t.Fatalf("message %s has routing key %q; want %q", r.ID, d.RoutingKey, topic)
					}
					out = append(out, r)
				}
				return out
			},
			Restart: func(t *testing.T) { testenv.RestartRabbitMQ(t) },
			Stop: func(t *testing.T) func(t *testing.T) {
				resume := testenv.PauseRabbitMQ(t)
				return func(t *testing.T) { resume(t) }
			},
			MaxPayload: testMaxMessageSize,
		}
	}
}

func TestConformanceClassicQueues(t *testing.T) {
	brokertest.Run(t, harness("classic"))
}

func TestConformanceQuorumQueues(t *testing.T) {
	brokertest.Run(t, harness("quorum"))
}

// publishOne publishes msgs and fails the test unless every result is nil.
func publishAll(t testing.TB, p outbox.Publisher, msgs ...*outbox.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, err := range p.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

func newMessage(topic, key, payload string) *outbox.Message {
	return &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: []byte(payload), CreatedAt: time.Now()}
}

func errorContains(t testing.TB, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}
