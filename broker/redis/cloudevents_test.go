package redis_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestCloudEvents: in both modes an entry read back from redis-server
// decodes (its header.* fields through cloudevents.MapHeaders) to the
// message's event: id, source, type, subject, time, data and the trace
// context; the outbox fields stay.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := client(t, s)
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(string(mode), func(t *testing.T) {
			p := dial(t, redis.Options{Addr: s.Addr(), CreateStreams: true,
				CloudEvents: &cloudevents.Options{Mode: mode, Source: "//orders.example.com/outbox", TypePrefix: "com.example."}})
			topic := "ce." + string(mode)
			m := newMessage(topic, "order-7", `{"order":7}`)
			m.CreatedAt = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
			m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Other": "x"}
			if err := publishOne(t, p, m); err != nil {
				t.Fatal(err)
			}
			got := received(t, topic, newReader(c, topic).read(t, 1)[0])
			if got.ID != m.ID || got.Key != m.Key || got.Headers["Other"] != "x" {
				t.Fatalf("entry %+v; want the message's ID, key and headers", got)
			}
			ev, err := cloudevents.Decode(cloudevents.Redis, cloudevents.MapHeaders(got.Headers), "", got.Payload)
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
