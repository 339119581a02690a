package outboxtrace_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	outboxtrace "github.com/outboxrelay/outbox/tracing/otel"
)

func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func TestInjectorWithoutSpanAddsNothingAndAllocatesNothing(t *testing.T) {
	inject := outboxtrace.Injector()
	h := map[string]string{"a": "b"}
	ctx := context.Background()
	if got := inject(ctx, h); len(got) != 1 || got["a"] != "b" {
		t.Fatalf("Injector without a span = %v, want the headers unchanged", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = inject(ctx, h) }); n != 0 {
		t.Errorf("Injector without a span allocates %v times per call, want 0", n)
	}
	if got := inject(ctx, nil); got != nil {
		t.Errorf("Injector without a span on nil headers = %v, want nil", got)
	}
}

func TestInjectorAddsTraceContextToACopy(t *testing.T) {
	tp, _ := newProvider(t)
	ctx, span := tp.Tracer("t").Start(context.Background(), "write")
	defer span.End()
	h := map[string]string{"a": "b", "traceparent": "stale"}
	got := outboxtrace.Injector()(ctx, h)
	want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
	if got["traceparent"] != want || got["a"] != "b" {
		t.Errorf("Injector = %v, want traceparent %s and a=b", got, want)
	}
	if h["traceparent"] != "stale" || len(h) != 2 {
		t.Errorf("Injector modified the caller's headers: %v", h)
	}
	m := outbox.Message{Topic: "t", Headers: got}
	if err := m.Validate(outbox.MaxPayloadDefault); err != nil {
		t.Errorf("a message with the injected headers does not validate: %v", err)
	}
}

func TestInjectorKeepsWithinTheHeaderLimits(t *testing.T) {
	tp, _ := newProvider(t)
	ctx, span := tp.Tracer("t").Start(context.Background(), "write")
	defer span.End()
	member, err := baggage.NewMember("big", strings.Repeat("x", outbox.MaxHeaderValueLen))
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx = baggage.ContextWithBaggage(ctx, bag)
	inject := outboxtrace.Injector(outboxtrace.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
	got := inject(ctx, nil)
	if got["traceparent"] == "" {
		t.Errorf("no traceparent: %v", got)
	}
	if _, ok := got["baggage"]; ok {
		t.Errorf("a baggage header over %d bytes was injected; the write would fail", outbox.MaxHeaderValueLen)
	}
	full := map[string]string{}
	for i := range outbox.MaxHeaders {
		full[fmt.Sprintf("h%d", i)] = "v"
	}
	if got := inject(ctx, full); len(got) != outbox.MaxHeaders {
		t.Errorf("headers at the limit got %d after injection, want %d (nothing added)", len(got), outbox.MaxHeaders)
	}
}

func TestPublishTracerRecordsFailuresAndRetries(t *testing.T) {
	tp, exp := newProvider(t)
	pt := outboxtrace.NewPublishTracer("kafka", outboxtrace.WithTracerProvider(tp))
	recs := []*outbox.Record{
		{Message: outbox.Message{ID: outbox.NewID(), Topic: "a"}},
		{Message: outbox.Message{ID: outbox.NewID(), Topic: "b"}, Attempts: 2, LastError: "broker down"},
		{Message: outbox.Message{ID: outbox.NewID(), Topic: "c"}},
	}
	msgs, end := pt.StartPublish(context.Background(), recs)
	for i, m := range msgs {
		if m == &recs[i].Message || m.Headers["traceparent"] == "" || recs[i].Headers != nil {
			t.Errorf("message %d: the tracer must send a copy with its context and leave the record alone (copy %v, headers %v, record headers %v)",
				i, m != &recs[i].Message, m.Headers, recs[i].Headers)
		}
	}
	end([]error{nil, errors.New("nack"), outbox.Permanent(errors.New("too large"))})
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	if s := byName["send a"]; s.Status.Code == codes.Error || attrMap(s.Attributes)["messaging.batch.message_count"] != "3" {
		t.Errorf("send a: status %v, attributes %v; want unset, batch count 3", s.Status, s.Attributes)
	}
	b := byName["send b"]
	if b.Status.Code != codes.Error || attrMap(b.Attributes)["error.type"] != "retryable" || attrMap(b.Attributes)["outbox.attempt"] != "3" {
		t.Errorf("send b: status %v, attributes %v; want Error, error.type retryable, outbox.attempt 3", b.Status, b.Attributes)
	}
	if len(b.Events) < 1 || b.Events[0].Name != "retry" || attrMap(b.Events[0].Attributes)["outbox.last_error"] != "broker down" {
		t.Errorf("send b: events %v, want a retry event with the last error", b.Events)
	}
	if c := byName["send c"]; attrMap(c.Attributes)["error.type"] != "permanent" {
		t.Errorf("send c: attributes %v, want error.type permanent", c.Attributes)
	}
	if msgs[0].Headers["traceparent"] != fmt.Sprintf("00-%s-%s-01", byName["send a"].SpanContext.TraceID(), byName["send a"].SpanContext.SpanID()) {
		t.Errorf("message a carries %q, not its producer span's context", msgs[0].Headers["traceparent"])
	}
}

type mapHeaders map[string]string

func (h mapHeaders) Get(k string) string { return h[k] }
func (h mapHeaders) Keys() []string {
	var ks []string
	for k := range h {
		ks = append(ks, k)
	}
	return ks
}

func TestHandleTracerMarksDuplicatesAndErrors(t *testing.T) {
	tp, exp := newProvider(t)
	ht := outboxtrace.NewHandleTracer(outboxtrace.WithTracerProvider(tp))
	for _, c := range []struct {
		processed bool
		err       error
	}{{true, nil}, {false, nil}, {false, errors.New("handler failed")}} {
		_, end := ht.StartHandle(context.Background(), inbox.Delivery{System: "nats", Destination: "orders", Consumer: "billing", MessageID: "m", Headers: mapHeaders{}})
		end(c.processed, c.err)
	}
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for i, want := range []string{"false", "true", "false"} {
		if got := attrMap(spans[i].Attributes)["outbox.duplicate"]; got != want {
			t.Errorf("span %d: outbox.duplicate = %s, want %s", i, got, want)
		}
	}
	if spans[2].Status.Code != codes.Error || spans[0].Status.Code == codes.Error {
		t.Errorf("statuses %v, %v: want only the failed handling in error", spans[0].Status, spans[2].Status)
	}
	if got := attrMap(spans[0].Attributes)["messaging.consumer.group.name"]; got != "billing" {
		t.Errorf("messaging.consumer.group.name = %q, want billing", got)
	}
}
