package cloudevents_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/inbox/consume"
	"github.com/outboxrelay/outbox/internal/inboxtest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var modes = []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured}

func ceOptions(mode cloudevents.Mode) *cloudevents.Options {
	return &cloudevents.Options{Mode: mode, Source: "//orders.example.com/outbox", TypePrefix: "com.example."}
}

// published publishes m through pub and fails unless the broker took it.
func published(t *testing.T, pub outbox.Publisher, m *outbox.Message) {
	t.Helper()
	if err := pub.Publish(t.Context(), []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
}

// newMessage is message() prepared as a store would write it, to topic.
func newMessage(topic string) *outbox.Message {
	m := message(`{"order":1}`, nil)
	m.Topic = topic
	return m
}

// checkEvent checks what the SDK and the consume helper read.
func checkEvent(t *testing.T, sdk *sdkMessage, helper *cloudevents.Event, helperErr error, m *outbox.Message) {
	t.Helper()
	ev := sdkEvent(t, sdk)
	if ev.Type() != "com.example."+m.Topic {
		t.Errorf("type %q, want com.example.%s", ev.Type(), m.Topic)
	}
	checkSDKEventExceptType(t, ev, m)
	if helperErr != nil {
		t.Fatalf("consume helper: %v", helperErr)
	}
	if helper.ID != m.ID || string(helper.Data) != string(m.Payload) || helper.Extensions["traceparent"] != traceparent {
		t.Errorf("consume helper read %+v", helper)
	}
}

// checkSDKEventExceptType is checkSDKEvent for a topic of the test's own.
func checkSDKEventExceptType(t *testing.T, ev interface {
	ID() string
	Source() string
	Subject() string
	DataContentType() string
	Data() []byte
	Time() time.Time
}, m *outbox.Message) {
	t.Helper()
	if ev.ID() != m.ID || ev.Source() != "//orders.example.com/outbox" || ev.Subject() != m.Key ||
		ev.DataContentType() != "application/json" || string(ev.Data()) != string(m.Payload) || !ev.Time().Equal(created) {
		t.Errorf("SDK read id %q source %q subject %q datacontenttype %q data %s time %v", ev.ID(), ev.Source(), ev.Subject(), ev.DataContentType(), ev.Data(), ev.Time())
	}
}

// TestNATSCloudEvents: the NATS publisher's messages in both modes, read
// by the SDK and by the consume helper on an embedded JetStream server;
// and a foreign structured event without the outbox's headers is
// deduplicated by its id.
func TestNATSCloudEvents(t *testing.T) {
	t.Parallel()
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
	ctx := t.Context()
	prefix := testenv.Name(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: strings.ToUpper(prefix), Subjects: []string{prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(t *testing.T, subject string) jetstream.Msg {
		t.Helper()
		c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			t.Fatal(err)
		}
		msg, err := c.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			pub, err := natsjs.New(js, natsjs.Options{CloudEvents: ceOptions(mode)})
			if err != nil {
				t.Fatal(err)
			}
			m := newMessage(prefix + "." + string(mode))
			published(t, pub, m)
			msg := fetch(t, m.Topic)
			headers := map[string]string{}
			for k, v := range msg.Headers() {
				headers[k] = v[0]
			}
			if mode == cloudevents.Binary && (headers["ce-id"] != m.ID || headers["ce-subject"] != "order%201%20%E2%82%AC") {
				t.Errorf("binary mode headers %v", headers)
			}
			ev, err := consume.NATSEvent(msg)
			checkEvent(t, newSDKMessage(cloudevents.NATS, "ce-", headers, headers["Content-Type"], msg.Data()), ev, err, m)
		})
	}

	t.Run("foreign structured event", func(t *testing.T) {
		subject := prefix + ".foreign"
		body := `{"specversion":"1.0","id":"evt-42","source":"urn:other","type":"other.thing","data":{"n":1}}`
		for range 2 { // the same event twice: the inbox handles it once
			msg := nats.NewMsg(subject)
			msg.Header.Set("Content-Type", cloudevents.ContentTypeStructured)
			msg.Data = []byte(body)
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
		c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "foreign", FilterSubject: subject})
		if err != nil {
			t.Fatal(err)
		}
		handled := 0
		h := consume.NATS[*sql.Tx]{Runner: inboxtest.SQLite(t), Consumer: "foreign", Handler: func(context.Context, *sql.Tx, jetstream.Msg) error { handled++; return nil }}
		batch, err := c.Fetch(2, jetstream.FetchMaxWait(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			if id := consume.NATSMessageID(msg); id != "evt-42" {
				t.Errorf("NATSMessageID = %q, want the event's id evt-42", id)
			}
			if _, err := h.Handle(ctx, msg); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n != 2 || handled != 1 {
			t.Fatalf("%d messages, handled %d times; want 2 and 1", n, handled)
		}
	})
}

// TestKafkaCloudEvents: the Kafka publisher's records in both modes, read
// by the SDK and by the consume helper, on kfake.
func TestKafkaCloudEvents(t *testing.T) {
	t.Parallel()
	seeds, _ := testenv.Kafka(t, kfake.AllowAutoTopicCreation())
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			pub, err := kafka.Dial(t.Context(), kafka.Options{Brokers: seeds, AllowAutoTopicCreation: true, CloudEvents: ceOptions(mode)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			m := newMessage(fmt.Sprintf("%s-%s", testenv.Name(t), mode))
			published(t, pub, m)
			cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(m.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var rec *kgo.Record
			for rec == nil {
				fs := cl.PollFetches(ctx)
				if err := ctx.Err(); err != nil {
					t.Fatal("no record within 30s")
				}
				fs.EachRecord(func(r *kgo.Record) { rec = r })
			}
			headers := map[string]string{}
			for _, h := range rec.Headers {
				headers[h.Key] = string(h.Value)
			}
			if string(rec.Key) != m.Key {
				t.Errorf("record key %q, want the message key %q", rec.Key, m.Key)
			}
			if mode == cloudevents.Binary && (headers["ce_id"] != m.ID || headers["content-type"] != "application/json") {
				t.Errorf("binary mode headers %v", headers)
			}
			ev, err := consume.KafkaEvent(rec)
			checkEvent(t, newSDKMessage(cloudevents.Kafka, "ce_", headers, headers["content-type"], rec.Value), ev, err, m)
		})
	}
}

// TestRabbitMQCloudEvents: the RabbitMQ publisher's messages in both
// modes, read by the SDK and by the consume helper, on RabbitMQ.
func TestRabbitMQCloudEvents(t *testing.T) {
	t.Parallel()
	url := testenv.RabbitMQ(t)
	exchange := testenv.Name(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			q, err := ch.QueueDeclare("", false, true, true, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			m := newMessage("orders." + string(mode))
			if err := ch.QueueBind(q.Name, m.Topic, exchange, false, nil); err != nil {
				t.Fatal(err)
			}
			pub, err := rabbitmq.Dial(t.Context(), url, rabbitmq.Options{Exchange: exchange, PassiveExchange: true, CloudEvents: ceOptions(mode)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			published(t, pub, m)
			deliveries, err := ch.Consume(q.Name, "", true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var d amqp.Delivery
			select {
			case d = <-deliveries:
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery within 30s")
			}
			headers := map[string]string{}
			for k, v := range d.Headers {
				if s, ok := v.(string); ok {
					headers[k] = s
				}
			}
			if mode == cloudevents.Binary && (headers["cloudEvents:id"] != m.ID || d.ContentType != "application/json") {
				t.Errorf("binary mode: headers %v, content type %q", headers, d.ContentType)
			}
			if mode == cloudevents.Structured && d.ContentType != cloudevents.ContentTypeStructured {
				t.Errorf("structured mode: content type %q", d.ContentType)
			}
			ev, err := consume.AMQPEvent(&d)
			checkEvent(t, newSDKMessage(cloudevents.AMQP, "cloudEvents:", headers, d.ContentType, d.Body), ev, err, m)
		})
	}
}
