package cloudevents_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/extensions"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

var created = time.Date(2026, 11, 27, 9, 30, 15, 123456789, time.UTC)

// message is an outbox message with a key that needs percent-encoding in
// NATS, a trace context, an extension and a dataschema header.
func message(payload string, headers map[string]string) *outbox.Message {
	h := map[string]string{"traceparent": traceparent, "tracestate": "congo=t61rcWkgMzE", "ce-tenant": "acme", "ce-dataschema": "https://example.com/order.json", "X-App": "kept"}
	for k, v := range headers {
		h[k] = v
	}
	return &outbox.Message{ID: outbox.NewID(), Topic: "orders.created", Key: "order 1 €", Payload: []byte(payload), CreatedAt: created, Headers: h}
}

// received is what a consumer of the binding gets for an encoded message.
func received(b cloudevents.Binding, m *outbox.Message, ct string) (map[string]string, string) {
	if b.ContentTypeHeader != "" {
		ct = m.Headers[b.ContentTypeHeader]
	}
	return m.Headers, ct
}

var bindings = []cloudevents.Binding{cloudevents.Kafka, cloudevents.AMQP, cloudevents.NATS}

// specPrefix is each binding's attribute prefix as its specification
// gives it (quoted in sdk_test.go).
var specPrefix = map[string]string{"kafka": "ce_", "amqp": "cloudEvents:", "nats": "ce-"}

// checkSDKEvent checks the attributes the SDK read.
func checkSDKEvent(t *testing.T, ev *event.Event, m *outbox.Message, contentType string, data []byte) {
	t.Helper()
	want := map[string]string{
		"id": m.ID, "source": "//orders.example.com/outbox", "specversion": "1.0", "type": "com.example.orders.created",
		"subject": m.Key, "datacontenttype": contentType, "dataschema": "https://example.com/order.json",
	}
	got := map[string]string{
		"id": ev.ID(), "source": ev.Source(), "specversion": ev.SpecVersion(), "type": ev.Type(),
		"subject": ev.Subject(), "datacontenttype": ev.DataContentType(), "dataschema": ev.DataSchema(),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if !ev.Time().Equal(created) {
		t.Errorf("time = %v, want %v", ev.Time(), created)
	}
	if tenant, _ := ev.Extensions()["tenant"].(string); tenant != "acme" {
		t.Errorf("extension tenant = %v, want acme (extensions %v)", ev.Extensions()["tenant"], ev.Extensions())
	}
	dt, ok := extensions.GetDistributedTracingExtension(*ev)
	if !ok || dt.TraceParent != traceparent || dt.TraceState != "congo=t61rcWkgMzE" {
		t.Errorf("distributed tracing extension = %+v, %v; want traceparent %s", dt, ok, traceparent)
	}
	if string(ev.Data()) != string(data) {
		t.Errorf("data = %q, want %q", ev.Data(), data)
	}
}

// TestEncodeReadBySDK: every binding, both modes: the CloudEvents SDK
// reads the event of a message with every attribute as the package
// documentation maps it, and Decode reads the same.
func TestEncodeReadBySDK(t *testing.T) {
	for _, b := range bindings {
		for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
			for _, data := range []struct {
				name, payload string
				headers       map[string]string
				contentType   string
			}{
				{"json", `{"order":1,"total":"9.90"}`, nil, "application/json"},
				{"bytes", "\x00\x01binary\xff", map[string]string{"Content-Type": "application/octet-stream"}, "application/octet-stream"},
			} {
				t.Run(b.Name+"/"+string(mode)+"/"+data.name, func(t *testing.T) {
					enc, err := cloudevents.NewEncoder(cloudevents.Options{Mode: mode, Source: "//orders.example.com/outbox", TypePrefix: "com.example."}, b)
					if err != nil {
						t.Fatal(err)
					}
					m := message(data.payload, data.headers)
					out, ct := enc.Encode(m)
					if m.Headers["ce-tenant"] != "acme" || len(m.Payload) != len(data.payload) {
						t.Fatal("Encode modified the message")
					}
					headers, ct := received(b, out, ct)
					if mode == cloudevents.Structured && !strings.HasPrefix(ct, "application/cloudevents+json") {
						t.Fatalf("structured mode: content type %q", ct)
					}
					if headers["X-App"] != "kept" {
						t.Errorf("the message's own header was dropped: %v", headers)
					}
					prefix := specPrefix[b.Name] // the bindings' text, not the package's constants
					ev := sdkEvent(t, newSDKMessage(b, prefix, headers, ct, out.Payload))
					checkSDKEvent(t, ev, m, data.contentType, []byte(data.payload))

					dec, err := cloudevents.Decode(b, mapHeaders(headers), map[bool]string{true: ct}[b.ContentTypeHeader == ""], out.Payload)
					if err != nil {
						t.Fatal(err)
					}
					if dec.ID != m.ID || dec.Subject != m.Key || dec.Type != "com.example.orders.created" || !dec.Time.Equal(created) ||
						dec.DataContentType != data.contentType || dec.Extensions["traceparent"] != traceparent || dec.Extensions["tenant"] != "acme" ||
						string(dec.Data) != data.payload {
						t.Errorf("Decode = %+v", dec)
					}
				})
			}
		}
	}
}

// mapHeaders is a cloudevents.Headers over a map.
type mapHeaders map[string]string

func (h mapHeaders) Get(k string) string { return h[k] }
func (h mapHeaders) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

// TestNATSPercentEncoding: the NATS binding's example, 3.1.3.2: `a header
// value of "Euro € 😀" SHOULD be encoded as ... "Euro%20%E2%82%AC%20%F0%9F%98%80"`;
// and decoding accepts lower case and a double-quoted value, and rejects
// invalid UTF-8 ("%C0%A0" ... MUST be rejected).
func TestNATSPercentEncoding(t *testing.T) {
	enc, err := cloudevents.NewEncoder(cloudevents.Options{}, cloudevents.NATS)
	if err != nil {
		t.Fatal(err)
	}
	m := &outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "Euro € 😀", CreatedAt: created}
	out, _ := enc.Encode(m)
	if got := out.Headers["ce-subject"]; got != "Euro%20%E2%82%AC%20%F0%9F%98%80" {
		t.Fatalf("ce-subject = %q", got)
	}
	h := mapHeaders{"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-subject": `"Euro%20%e2%82%ac"`}
	ev, err := cloudevents.Decode(cloudevents.NATS, h, "", nil)
	if err != nil || ev.Subject != "Euro €" {
		t.Fatalf("Decode = %+v, %v", ev, err)
	}
	h["ce-subject"] = "%C0%A0"
	if _, err := cloudevents.Decode(cloudevents.NATS, h, "", nil); !errors.Is(err, cloudevents.ErrNotCloudEvent) {
		t.Fatalf("an overlong encoding: %v, want ErrNotCloudEvent", err)
	}
}

// TestDecodeForeignEvents: events from other producers: AMQP's '_'
// separator, a structured event with data as a JSON string, and what is
// no CloudEvent.
func TestDecodeForeignEvents(t *testing.T) {
	h := mapHeaders{"cloudEvents_specversion": "1.0", "cloudEvents_id": "a-1", "cloudEvents_source": "urn:x", "cloudEvents_type": "x.created"}
	ev, err := cloudevents.Decode(cloudevents.AMQP, h, "text/plain", []byte("hi"))
	if err != nil || ev.ID != "a-1" || ev.DataContentType != "text/plain" || string(ev.Data) != "hi" {
		t.Fatalf("AMQP '_' separator: %+v, %v", ev, err)
	}
	body := `{"specversion":"1.0","id":"s-1","source":"/s","type":"t","datacontenttype":"text/plain","data":"plain text","count":3}`
	ev, err = cloudevents.Decode(cloudevents.Kafka, mapHeaders{"content-type": "application/cloudevents+json; charset=UTF-8"}, "", []byte(body))
	if err != nil || string(ev.Data) != "plain text" || ev.Extensions["count"] != "3" {
		t.Fatalf("structured text data: %+v, %v", ev, err)
	}
	for name, c := range map[string]struct {
		h    mapHeaders
		ct   string
		body string
	}{
		"no headers":      {mapHeaders{}, "", "{}"},
		"missing type":    {mapHeaders{"ce_specversion": "1.0", "ce_id": "1", "ce_source": "/s"}, "", ""},
		"version 0.3":     {mapHeaders{"ce_specversion": "0.3", "ce_id": "1", "ce_source": "/s", "ce_type": "t"}, "", ""},
		"bad time":        {mapHeaders{"ce_specversion": "1.0", "ce_id": "1", "ce_source": "/s", "ce_type": "t", "ce_time": "yesterday"}, "", ""},
		"structured junk": {mapHeaders{"content-type": "application/cloudevents+json"}, "", "not json"},
		"avro format":     {mapHeaders{"content-type": "application/cloudevents+avro"}, "", ""},
	} {
		if _, err := cloudevents.Decode(cloudevents.Kafka, c.h, c.ct, []byte(c.body)); !errors.Is(err, cloudevents.ErrNotCloudEvent) {
			t.Errorf("%s: Decode error %v, want ErrNotCloudEvent", name, err)
		}
	}
}

// TestOptionsErrors: each bad option is named.
func TestOptionsErrors(t *testing.T) {
	for _, c := range []struct {
		opts cloudevents.Options
		want string
	}{
		{cloudevents.Options{Mode: "batch"}, "Options.Mode"},
		{cloudevents.Options{Source: "has space"}, "Options.Source"},
		{cloudevents.Options{DataContentType: "json"}, "Options.DataContentType"},
		{cloudevents.Options{TypePrefix: "com example"}, "Options.TypePrefix"},
	} {
		if _, err := cloudevents.NewEncoder(c.opts, cloudevents.Kafka); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.opts, err, c.want)
		}
	}
	if _, err := cloudevents.ParseMode("Structured"); err != nil {
		t.Error(err)
	}
	if _, err := cloudevents.ParseMode("json"); err == nil {
		t.Error("ParseMode accepted json")
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts has the
// required attributes.
func FuzzDecode(f *testing.F) {
	f.Add("ce-id", "1", "application/cloudevents+json", []byte(`{"specversion":"1.0","id":"1","source":"/","type":"t","data":1}`))
	f.Add("ce-subject", `"%zz`, "", []byte("x"))
	f.Fuzz(func(t *testing.T, k, v, ct string, body []byte) {
		h := mapHeaders{"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t", k: v}
		for _, b := range bindings {
			ev, err := cloudevents.Decode(b, h, ct, body)
			if err == nil && (ev.ID == "" || ev.Source == "" || ev.Type == "" || ev.SpecVersion != "1.0") {
				t.Fatalf("accepted %+v", ev)
			}
		}
	})
}
