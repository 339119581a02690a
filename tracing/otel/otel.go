// Package outboxtrace carries OpenTelemetry traces through the outbox: a
// span that writes a message continues in the relay that publishes it and
// in the consumer that handles it, as one trace.
//
//	// Writers: the trace context of Write's ctx goes into the message's
//	// headers (W3C traceparent and tracestate by default).
//	store, err := postgres.Open(ctx, dsn, postgres.Options{Inject: outboxtrace.Injector()})
//	… store.Writer().Write(ctx, tx, msg) …
//
//	// The relay: a producer span per message published, a child of the
//	// writer's span, whose context travels to the broker in the headers.
//	relay, err := outbox.NewRelay(store, pub, outbox.Config{Tracer: outboxtrace.NewPublishTracer("nats")})
//
//	// Consumers: the inbox transaction and the handler run in a consumer
//	// span, a child of the producer span.
//	h := &consume.NATS[pgx.Tx]{…, Tracer: outboxtrace.NewHandleTracer()}
//
// Nothing here uses global state unless asked: the tracer provider is
// otel.GetTracerProvider() unless [WithTracerProvider] gives one, and the
// propagator is W3C Trace Context ([propagation.TraceContext]) unless
// [WithPropagator] gives another (a composite with
// [propagation.Baggage], or otel.GetTextMapPropagator()). A write whose
// ctx carries no span context (and no baggage) gets no header and costs no
// allocation.
//
// # Spans
//
// The relay's span is named "send <topic>", of kind producer, with the
// OpenTelemetry messaging attributes messaging.system (the name given to
// NewPublishTracer: "nats", "rabbitmq", "kafka"), messaging.destination.name
// (the topic), messaging.message.id, messaging.operation.type "send" and,
// for a batch of more than one message, messaging.batch.message_count. It
// also carries outbox.attempt (1 for the first attempt); a retry has a
// "retry" event with the previous attempt's error. The attributes are set
// once the span is sampled (a sampler does not see them), so that the many
// spans a low sampling ratio drops cost as little as they can. A failed publish sets
// the span's status to Error, records the error and sets error.type to
// "permanent", "blocked", "timeout" or "retryable".
//
// The consumer's span is named "process <destination>", of kind consumer,
// with messaging.system, messaging.destination.name,
// messaging.message.id, messaging.consumer.group.name (the inbox
// consumer), messaging.operation.type "process" and outbox.duplicate (true
// when the inbox dropped the message as a duplicate).
package outboxtrace

import (
	"context"
	"errors"
	"maps"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
)

// ScopeName is the instrumentation scope of the tracers this package
// creates.
const ScopeName = "github.com/outboxrelay/outbox/tracing/otel"

// Option configures the functions of this package.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// WithTracerProvider sets the tracer provider (default
// otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithPropagator sets the propagator that writes and reads the trace
// context in message headers (default propagation.TraceContext{}, the W3C
// traceparent and tracestate headers).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = propagation.TraceContext{}
	}
	return c
}

func (c config) tracer() trace.Tracer { return c.tp.Tracer(ScopeName) }

// Injector returns the outbox.HeaderInjector for a store's Options.Inject:
// it adds to each message written the context of the span (and the
// baggage, with a propagator that carries it) of Write's ctx. A header the
// message already has under the same name is replaced; a value longer than
// outbox.MaxHeaderValueLen, or a header beyond outbox.MaxHeaders, is left
// out, so that tracing never makes a write fail. Only WithPropagator
// matters here.
func Injector(opts ...Option) outbox.HeaderInjector {
	prop := newConfig(opts).prop
	return func(ctx context.Context, headers map[string]string) map[string]string {
		if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
			return headers
		}
		add := propagation.MapCarrier{}
		prop.Inject(ctx, add)
		if len(add) == 0 {
			return headers
		}
		out := make(map[string]string, len(headers)+len(add))
		maps.Copy(out, headers)
		for k, v := range add {
			_, replaces := out[k]
			if len(v) > outbox.MaxHeaderValueLen || !replaces && len(out) >= outbox.MaxHeaders {
				continue
			}
			out[k] = v
		}
		return out
	}
}

// NewPublishTracer returns the outbox.PublishTracer for Config.Tracer: one
// producer span per message published (see the package documentation),
// whose parent is the context the writer injected into the message's
// headers (a new trace when there is none), and whose own context replaces
// it in the headers sent to the broker. system names the broker for
// messaging.system: "nats", "rabbitmq" or "kafka".
func NewPublishTracer(system string, opts ...Option) outbox.PublishTracer {
	c := newConfig(opts)
	return &publishTracer{tracer: c.tracer(), prop: c.prop, system: semconv.MessagingSystemKey.String(system)}
}

// producerKind is the start option of every producer span.
var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

type publishTracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	system attribute.KeyValue
}

func (p *publishTracer) StartPublish(ctx context.Context, recs []*outbox.Record) ([]*outbox.Message, func([]error)) {
	msgs := make([]*outbox.Message, len(recs))
	copies := make([]outbox.Message, len(recs)) // one allocation for the batch
	spans := make([]trace.Span, len(recs))
	for i, r := range recs {
		parent := p.prop.Extract(ctx, propagation.MapCarrier(r.Headers))
		sctx, span := p.tracer.Start(parent, "send "+r.Topic, producerKind)
		if span.IsRecording() {
			// Only a sampled span pays for its attributes: most are not
			// at a low sampling ratio (BenchmarkPublishTracing).
			attrs := []attribute.KeyValue{
				p.system,
				semconv.MessagingDestinationName(r.Topic),
				semconv.MessagingMessageID(r.ID),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"),
				attribute.Int("outbox.attempt", r.Attempts+1),
			}
			if len(recs) > 1 {
				attrs = append(attrs, semconv.MessagingBatchMessageCount(len(recs)))
			}
			span.SetAttributes(attrs...)
		}
		if r.Attempts > 0 && span.IsRecording() {
			span.AddEvent("retry", trace.WithAttributes(
				attribute.Int("outbox.attempt", r.Attempts+1),
				attribute.String("outbox.last_error", r.LastError),
			))
		}
		m := &copies[i]
		*m = r.Message
		m.Headers = make(map[string]string, len(r.Headers)+2)
		maps.Copy(m.Headers, r.Headers)
		p.prop.Inject(sctx, propagation.MapCarrier(m.Headers))
		msgs[i], spans[i] = m, span
	}
	return msgs, func(errs []error) {
		for i, span := range spans {
			if i < len(errs) && errs[i] != nil && span.IsRecording() {
				span.RecordError(errs[i])
				span.SetStatus(codes.Error, errs[i].Error())
				span.SetAttributes(semconv.ErrorTypeKey.String(errorType(errs[i])))
			}
			span.End()
		}
	}
}

// errorType classifies a publish error for error.type.
func errorType(err error) string {
	if outbox.IsPermanent(err) {
		return "permanent"
	}
	if _, ok := outbox.IsBlocked(err); ok {
		return "blocked"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "retryable"
}

// NewHandleTracer returns the inbox.Tracer for the consume helpers'
// Tracer field: a consumer span per message handled (see the package
// documentation), a child of the span whose context the message's headers
// carry.
func NewHandleTracer(opts ...Option) inbox.Tracer {
	c := newConfig(opts)
	return &handleTracer{tracer: c.tracer(), prop: c.prop}
}

type handleTracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func (h *handleTracer) StartHandle(ctx context.Context, d inbox.Delivery) (context.Context, func(bool, error)) {
	if d.Headers != nil {
		ctx = h.prop.Extract(ctx, headerCarrier{d.Headers})
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(d.System),
		semconv.MessagingDestinationName(d.Destination),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingConsumerGroupName(d.Consumer),
	}
	if d.MessageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(d.MessageID))
	}
	ctx, span := h.tracer.Start(ctx, "process "+d.Destination, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, func(processed bool, err error) {
		span.SetAttributes(attribute.Bool("outbox.duplicate", !processed && err == nil))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// headerCarrier adapts an inbox.HeaderReader to the propagators (which
// only read when extracting).
type headerCarrier struct{ h inbox.HeaderReader }

func (c headerCarrier) Get(key string) string { return c.h.Get(key) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return c.h.Keys() }
