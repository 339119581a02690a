package sns_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sns"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func ceOpts(mode cloudevents.Mode) *cloudevents.Options {
	return &cloudevents.Options{Mode: mode, Source: "//orders.example.com/outbox", TypePrefix: "com.example."}
}

// TestCloudEvents: in both modes a message read back from goaws decodes
// (its attributes, Outbox-Headers unpacked, through
// cloudevents.MapHeaders) to the message's event: id, source, type,
// subject, time, data and the trace context; the outbox attributes stay.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	g := testenv.GoAWSServer(t)
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(string(mode), func(t *testing.T) {
			p := dial(t, g, sns.Options{CloudEvents: ceOpts(mode)})
			topic := "ce." + testenv.Name(t)
			name := strings.ReplaceAll(topic, ".", "-")
			topicWithQueue(t, g, name)
			rd := &reader{g: g, queue: name}
			m := &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: "order-7", Payload: []byte(`{"order":7}`),
				CreatedAt: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC),
				Headers:   map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Other": "x"}}
			if err := p.Publish(context.Background(), []*outbox.Message{m})[0]; err != nil {
				t.Fatal(err)
			}
			got := received(t, topic, rd.read(t, 1)[0])
			if got.ID != m.ID || got.Key != m.Key || got.Headers["Other"] != "x" {
				t.Fatalf("message %+v; want the message's ID, key and headers", got)
			}
			ev, err := cloudevents.Decode(cloudevents.SNS, cloudevents.MapHeaders(got.Headers), "", got.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if ev.ID != m.ID || ev.Source != "//orders.example.com/outbox" || ev.Type != "com.example."+topic || ev.Subject != "order-7" ||
				!ev.Time.Equal(m.CreatedAt) || string(ev.Data) != `{"order":7}` || ev.Extensions["traceparent"] != m.Headers["traceparent"] {
				t.Fatalf("event %+v", ev)
			}
		})
	}
}
