package outboxtrace_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/consume"
	inboxsqlite "github.com/outboxrelay/outbox/inbox/sqlite"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
	outboxtrace "github.com/outboxrelay/outbox/tracing/otel"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const topic = "orders.created"

// traceEnv is the traced pipeline of one test: an in-memory exporter, a
// PostgreSQL outbox whose writes inject the trace context, and a consumer
// inbox.
type traceEnv struct {
	ctx   context.Context
	exp   *tracetest.InMemoryExporter
	tp    *sdktrace.TracerProvider
	store *postgres.Store
	inbox *inboxsqlite.Inbox
}

func newTraceEnv(t *testing.T) *traceEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	store, err := postgres.Open(ctx, testenv.PostgresDSN(t), postgres.Options{Schema: testenv.Name(t), Partitions: 4, Inject: outboxtrace.Injector()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "consumer.db")+"?_pragma=busy_timeout(30000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	in, err := inboxsqlite.New(db, inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &traceEnv{ctx: ctx, exp: exp, tp: tp, store: store, inbox: in}
}

// writeInSpan writes one message in a transaction, inside the span "place
// order", and returns the message's ID.
func (e *traceEnv) writeInSpan(t *testing.T) string {
	t.Helper()
	ctx, span := e.tp.Tracer("app").Start(e.ctx, "place order")
	defer span.End()
	id := outbox.NewID()
	err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
		return e.store.Writer().Write(ctx, tx, outbox.Message{ID: id, Topic: topic, Key: "order-1", Payload: []byte(`{"id":1}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// relay runs a relay with a tracer for system until the test ends.
func (e *traceEnv) relay(t *testing.T, pub outbox.Publisher, system string) {
	t.Helper()
	r, err := outbox.NewRelay(e.store, pub, outbox.Config{
		Tracer:         outboxtrace.NewPublishTracer(system, outboxtrace.WithTracerProvider(e.tp)),
		PollInterval:   20 * time.Millisecond,
		PublishTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
}

// handler is the consumer's effect: it starts the span "handle order" in
// the context the consume helper gives it.
func (e *traceEnv) handler(ctx context.Context) error {
	_, span := e.tp.Tracer("app").Start(ctx, "handle order")
	span.End()
	return nil
}

func (e *traceEnv) handleTracer() inbox.Tracer {
	return outboxtrace.NewHandleTracer(outboxtrace.WithTracerProvider(e.tp))
}

// checkTrace checks the spans: "place order" → "send orders.created"
// (producer) → "process <destination>" (consumer) → "handle order", one
// trace, each the parent of the next, with the messaging attributes.
func (e *traceEnv) checkTrace(t *testing.T, system, destination, id string) {
	t.Helper()
	// The consumer may handle the message before the relay has ended its
	// producer span (the span ends once Publish returned): wait for it.
	deadline := time.Now().Add(30 * time.Second)
	for len(e.exp.GetSpans()) < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	spans := map[string]tracetest.SpanStub{}
	for _, s := range e.exp.GetSpans() {
		if _, dup := spans[s.Name]; dup {
			t.Errorf("two spans named %q", s.Name)
		}
		spans[s.Name] = s
	}
	chain := []struct {
		name string
		kind trace.SpanKind
	}{
		{"place order", trace.SpanKindInternal},
		{"send " + topic, trace.SpanKindProducer},
		{"process " + destination, trace.SpanKindConsumer},
		{"handle order", trace.SpanKindInternal},
	}
	var parent tracetest.SpanStub
	for i, c := range chain {
		s, ok := spans[c.name]
		if !ok {
			t.Fatalf("no span %q; spans: %v", c.name, names(e.exp.GetSpans()))
		}
		if s.SpanKind != c.kind {
			t.Errorf("span %q has kind %v, want %v", c.name, s.SpanKind, c.kind)
		}
		if i == 0 {
			if s.Parent.IsValid() {
				t.Errorf("span %q has a parent: %v", c.name, s.Parent)
			}
		} else {
			if s.SpanContext.TraceID() != parent.SpanContext.TraceID() {
				t.Errorf("span %q is in trace %s, %q in %s: want one trace", c.name, s.SpanContext.TraceID(), parent.Name, parent.SpanContext.TraceID())
			}
			if s.Parent.SpanID() != parent.SpanContext.SpanID() {
				t.Errorf("span %q has parent %s, want %q (%s)", c.name, s.Parent.SpanID(), parent.Name, parent.SpanContext.SpanID())
			}
		}
		parent = s
	}
	for _, name := range []string{"send " + topic, "process " + destination} {
		attrs := attrMap(spans[name].Attributes)
		for k, want := range map[string]string{
			"messaging.system":           system,
			"messaging.destination.name": map[bool]string{true: topic, false: destination}[name == "send "+topic],
			"messaging.message.id":       id,
		} {
			if got := attrs[k]; got != want {
				t.Errorf("span %q: %s = %q, want %q", name, k, got, want)
			}
		}
	}
	if got := attrMap(spans["send "+topic].Attributes)["outbox.attempt"]; got != "1" {
		t.Errorf("producer span: outbox.attempt = %q, want 1", got)
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func TestTraceThroughNATS(t *testing.T) {
	t.Parallel()
	e := newTraceEnv(t)
	srv := testenv.NATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(e.ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.Dial(srv.ClientURL(), natsjs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })

	id := e.writeInSpan(t)
	e.relay(t, pub, "nats")

	cons, err := stream.CreateOrUpdateConsumer(e.ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	h := &consume.NATS[*sql.Tx]{
		Runner:   e.inbox,
		Consumer: "billing",
		Handler:  func(ctx context.Context, _ *sql.Tx, _ jetstream.Msg) error { return e.handler(ctx) },
		Tracer:   e.handleTracer(),
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var handled int
	for msg := range batch.Messages() {
		if processed, err := h.Handle(e.ctx, msg); !processed || err != nil {
			t.Fatalf("Handle: processed %v, err %v", processed, err)
		}
		handled++
	}
	if handled != 1 {
		t.Fatalf("handled %d messages, want 1 (fetch error: %v)", handled, batch.Error())
	}
	e.checkTrace(t, "nats", topic, id)
}

func TestTraceThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	e := newTraceEnv(t)
	url := testenv.RabbitMQ(t)
	exchange, queue := testenv.Name(t)+"_x", testenv.Name(t)+"_q"
	pub, err := rabbitmq.Dial(e.ctx, url, rabbitmq.Options{Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "orders.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(exchange, false, false) })
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	id := e.writeInSpan(t)
	e.relay(t, pub, "rabbitmq")

	h := &consume.AMQP[*sql.Tx]{
		Runner:   e.inbox,
		Consumer: "billing",
		Handler:  func(ctx context.Context, _ *sql.Tx, _ *amqp.Delivery) error { return e.handler(ctx) },
		Tracer:   e.handleTracer(),
	}
	select {
	case d := <-deliveries:
		if processed, err := h.Handle(e.ctx, &d); !processed || err != nil {
			t.Fatalf("Handle: processed %v, err %v", processed, err)
		}
	case <-e.ctx.Done():
		t.Fatal("no delivery")
	}
	e.checkTrace(t, "rabbitmq", topic, id)
}

func TestTraceThroughKafka(t *testing.T) {
	t.Parallel()
	e := newTraceEnv(t)
	seeds, _ := testenv.Kafka(t, kfake.SeedTopics(1, topic))
	pub, err := kafka.Dial(e.ctx, kafka.Options{Brokers: seeds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics(topic),
		kgo.AutoCommitMarks(), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)

	id := e.writeInSpan(t)
	e.relay(t, pub, "kafka")

	h := &consume.Kafka[*sql.Tx]{
		Runner:   e.inbox,
		Consumer: "billing",
		Handler:  func(ctx context.Context, _ *sql.Tx, _ *kgo.Record) error { return e.handler(ctx) },
		Marker:   cl,
		Tracer:   e.handleTracer(),
	}
	var recs []*kgo.Record
	for len(recs) == 0 {
		fs := cl.PollRecords(e.ctx, 1)
		if err := e.ctx.Err(); err != nil {
			t.Fatalf("no record: %v", err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		recs = fs.Records()
	}
	if processed, err := h.Handle(e.ctx, recs[0]); !processed || err != nil {
		t.Fatalf("Handle: processed %v, err %v", processed, err)
	}
	e.checkTrace(t, "kafka", topic, id)
}
