package kinesis_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestCloudEvents: in both modes a record read back from kinesalite
// decodes (kinesis.Decode, then cloudevents.Decode) to the message's event:
// id, source, type, subject, time, data and the trace context; the
// envelope keeps the outbox ID and key.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	k := testenv.KinesaliteServer(t)
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(string(mode), func(t *testing.T) {
			p := dial(t, k, kinesis.Options{CloudEvents: &cloudevents.Options{Mode: mode, Source: "//orders.example.com/outbox", TypePrefix: "com.example."}})
			topic := "ce." + testenv.Name(t)
			createStream(t, k, p.Stream(topic), 1)
			m := newMessage(topic, "order-7", `{"order":7}`)
			m.CreatedAt = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
			m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Other": "x"}
			if err := p.Publish(context.Background(), []*outbox.Message{m})[0]; err != nil {
				t.Fatal(err)
			}
			got, err := kinesis.Decode(newReader(k, p.Stream(topic)).read(t, 1)[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != m.ID || got.Key != m.Key || got.Headers["Other"] != "x" {
				t.Fatalf("envelope %+v; want the message's ID, key and headers", got)
			}
			ev, err := cloudevents.Decode(cloudevents.Kinesis, cloudevents.MapHeaders(got.Headers), "", got.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if ev.ID != m.ID || ev.Source != "//orders.example.com/outbox" || ev.Type != "com.example."+topic || ev.Subject != "order-7" ||
				!ev.Time.Equal(m.CreatedAt) || string(ev.Data) != `{"order":7}` || ev.DataContentType != "application/json" ||
				ev.Extensions["traceparent"] != m.Headers["traceparent"] {
				t.Fatalf("event %+v", ev)
			}
			if mode == cloudevents.Structured && !cloudevents.IsStructured(got.Headers["Content-Type"]) {
				t.Errorf("structured mode: Content-Type %q", got.Headers["Content-Type"])
			}
		})
	}
}
