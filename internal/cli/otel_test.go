package cli_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox/consume"
	"github.com/outboxrelay/outbox/internal/inboxtest"
	"github.com/outboxrelay/outbox/internal/testenv"
	outboxtrace "github.com/outboxrelay/outbox/tracing/otel"
)

// receivedSpan is a span an OTLP receiver got, with the service that
// exported it.
type receivedSpan struct {
	service string
	span    *tracepb.Span
}

// otlpReceiver collects what OTLP exporters send it: an in-process
// collector endpoint decoding the OTLP protobuf requests.
type otlpReceiver struct {
	mu      sync.Mutex
	spans   []receivedSpan
	authz   []string // the authorization header of each request
	badReqs int
}

func (r *otlpReceiver) add(req *coltracepb.ExportTraceServiceRequest, authz string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.authz = append(r.authz, authz)
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service, sp})
			}
		}
	}
}

// find returns the span named name, or nil.
func (r *otlpReceiver) find(name string) *receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.spans {
		if r.spans[i].span.GetName() == name {
			s := r.spans[i]
			return &s
		}
	}
	return nil
}

func (r *otlpReceiver) authorizations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.authz...)
}

// serveHTTP starts the receiver's OTLP/HTTP endpoint (POST /v1/traces,
// application/x-protobuf) and returns its base URL.
func (r *otlpReceiver) serveHTTP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil || proto.Unmarshal(body, &msg) != nil {
			r.mu.Lock()
			r.badReqs++
			r.mu.Unlock()
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.add(&msg, req.Header.Get("Authorization"))
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// grpcTraceService is the receiver's OTLP/gRPC TraceService.
type grpcTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *otlpReceiver
}

func (g grpcTraceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	authz := ""
	if v := md.Get("authorization"); len(v) > 0 {
		authz = v[0]
	}
	g.r.add(req, authz)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveGRPC starts the receiver's OTLP/gRPC endpoint and returns its URL.
func (r *otlpReceiver) serveGRPC(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, grpcTraceService{r: r})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return "http://" + lis.Addr().String()
}

// TestRelayExportsSpansOverOTLP runs `outbox relay` with the standard
// OTEL_* variables pointing at an OTLP receiver the test started, for each
// protocol: the receiver gets one trace from the writer's span through the
// relay's producer span to the consumer helper's span, the relay's export
// carries the configured header, and the header's value appears in no log.
func TestRelayExportsSpansOverOTLP(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) {
			t.Parallel()
			const secret = "s3cr3t-otlp-token"
			recv := &otlpReceiver{}
			var endpoint string
			if protocol == "grpc" {
				endpoint = recv.serveGRPC(t)
			} else {
				endpoint = recv.serveHTTP(t)
			}
			ctx := t.Context()
			dsn := migrated(t, 4)
			ns := testenv.NATS(t)
			st := stream(t, ns, "orders.>")

			// The writer: an application exporting its own spans to the
			// same collector (over OTLP/HTTP), writing in a span.
			writerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(newHTTPExporter(t, recv.serveHTTP(t))))
			wctx, wspan := writerTP.Tracer("app").Start(ctx, "place order")
			msg := outbox.Message{Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`)}
			msg.Headers = outboxtrace.Injector()(wctx, nil)
			write(t, dsn, []outbox.Message{msg})
			wspan.End()

			vars := map[string]string{
				"OUTBOX_STORE":                dsn,
				"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
				"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
				"OTEL_EXPORTER_OTLP_HEADERS":  "authorization=Bearer%20" + secret,
				"OTEL_SERVICE_NAME":           "relay-under-test",
				"OTEL_TRACES_SAMPLER":         "parentbased_always_on",
			}
			b := start(t, vars, "relay", "--broker", ns.ClientURL(), "--http-addr", "", "--log-format", "json", "--poll-interval", "50ms")

			// The consumer: the consume helper with a handle tracer, its
			// application exporting to the collector too.
			consumerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(newHTTPExporter(t, recv.serveHTTP(t))))
			cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			h := consume.NATS[*sql.Tx]{
				Runner:   inboxtest.SQLite(t),
				Consumer: "billing",
				Handler: func(ctx context.Context, _ *sql.Tx, _ jetstream.Msg) error {
					_, span := consumerTP.Tracer("app").Start(ctx, "handle order")
					span.End()
					return nil
				},
				Tracer: outboxtrace.NewHandleTracer(outboxtrace.WithTracerProvider(consumerTP)),
			}
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(waitFor))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for m := range batch.Messages() {
				if processed, err := h.Handle(ctx, m); !processed || err != nil {
					t.Fatalf("Handle = %v, %v", processed, err)
				}
				got++
			}
			if got != 1 {
				t.Fatalf("consumed %d messages, want 1 (fetch: %v)", got, batch.Error())
			}
			// Stopping the relay flushes its buffered spans.
			if code := b.stop(t); code != 0 {
				t.Fatalf("relay exited %d:\n%s", code, b.stderr)
			}

			writer, producer, consumer, handler := recv.find("place order"), recv.find("send orders.created"), recv.find("process orders.created"), recv.find("handle order")
			if writer == nil || producer == nil || consumer == nil || handler == nil {
				t.Fatalf("spans received: writer %v, producer %v, consumer %v, handler %v; want all four\nrelay log:\n%s", writer != nil, producer != nil, consumer != nil, handler != nil, b.stderr)
			}
			trace := hex.EncodeToString(writer.span.GetTraceId())
			for _, s := range []*receivedSpan{producer, consumer, handler} {
				if id := hex.EncodeToString(s.span.GetTraceId()); id != trace {
					t.Errorf("span %q is in trace %s, want the writer's %s", s.span.GetName(), id, trace)
				}
			}
			parentOf := func(child, parent *receivedSpan) {
				t.Helper()
				if hex.EncodeToString(child.span.GetParentSpanId()) != hex.EncodeToString(parent.span.GetSpanId()) {
					t.Errorf("span %q's parent is %x, want %q (%x)", child.span.GetName(), child.span.GetParentSpanId(), parent.span.GetName(), parent.span.GetSpanId())
				}
			}
			parentOf(producer, writer)
			parentOf(consumer, producer)
			parentOf(handler, consumer)
			if producer.service != "relay-under-test" || producer.span.GetKind() != tracepb.Span_SPAN_KIND_PRODUCER {
				t.Errorf("producer span: service %q, kind %v; want relay-under-test, producer", producer.service, producer.span.GetKind())
			}
			relayExport := false
			for _, a := range recv.authorizations() {
				relayExport = relayExport || a == "Bearer "+secret
			}
			if !relayExport {
				t.Errorf("no export carried the configured authorization header: %q", recv.authorizations())
			}
			if recv.badReqs != 0 {
				t.Errorf("%d malformed OTLP requests", recv.badReqs)
			}
			if log := b.stderr.String(); strings.Contains(log, secret) || !strings.Contains(log, `"msg":"tracing: exporting spans over OTLP"`) {
				t.Errorf("relay log leaks the header or lacks the tracing line:\n%s", log)
			}
		})
	}
}

func newHTTPExporter(t *testing.T, endpoint string) sdktrace.SpanExporter {
	t.Helper()
	exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(endpoint+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	return exp
}

// TestRelayTracingSettings: tracing is off without an endpoint and when
// OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none say so; a bad setting is
// a usage error naming the variable or flag; the headers never print.
func TestRelayTracingSettings(t *testing.T) {
	t.Parallel()
	dsn := "postgres://app@127.0.0.1:1/app"
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"bad sampler", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "sometimes"}, nil, "OTEL_TRACES_SAMPLER must be one of"},
		{"bad ratio", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, nil, "OTEL_TRACES_SAMPLER_ARG must be a ratio between 0 and 1"},
		{"bad protocol flag", nil, []string{"--otel-endpoint", "http://127.0.0.1:4318", "--otel-protocol", "udp"}, "--otel-protocol must be http/protobuf or grpc"},
		{"json protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, nil, "OTEL_EXPORTER_OTLP_PROTOCOL: http/json is not supported"},
		{"endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, nil, "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL"},
		{"zipkin", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, nil, `OTEL_TRACES_EXPORTER="zipkin" is not supported`},
		{"bad headers", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=%zzsecret"}, nil, `OTEL_EXPORTER_OTLP_HEADERS: the value of "authorization" is not valid percent-encoding`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := map[string]string{"OUTBOX_STORE": dsn}
			for k, v := range tc.vars {
				vars[k] = v
			}
			r := run(t, vars, append([]string{"relay", "--broker", "nats://127.0.0.1:1", "--http-addr", ""}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("want exit 2 with %q; got %v", tc.want, r)
			}
			if strings.Contains(r.stderr, "secret") {
				t.Fatalf("the error shows a header value:\n%s", r.stderr)
			}
		})
	}

	// The config file's keys are the flags': a bad one names the file's
	// line, and the flags beat the standard variables.
	cfg := writeConfig(t, "otel-endpoint: http://127.0.0.1:4318\notel-sampler: never\n")
	r := run(t, map[string]string{"OUTBOX_STORE": dsn, "OTEL_TRACES_SAMPLER": "always_on"}, "relay", "--broker", "nats://127.0.0.1:1", "--http-addr", "", "--config", cfg)
	if r.code != 2 || !strings.Contains(r.stderr, "--otel-sampler (from "+cfg+" line 2) must be one of") {
		t.Fatalf("config file with a bad sampler: %v", r)
	}

	// --print-config hides the headers, whichever way they came.
	r = mustRun(t, map[string]string{"OUTBOX_OTEL_HEADERS": "authorization=Bearer%20topsecret"}, "relay", "--print-config")
	if strings.Contains(r.stdout, "topsecret") || !strings.Contains(r.stdout, "otel-headers") {
		t.Fatalf("print-config:\n%s", r.stdout)
	}
}
