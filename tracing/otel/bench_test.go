package outboxtrace_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outbox"
	outboxtrace "github.com/outboxrelay/outbox/tracing/otel"
)

// cpuTime is the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPublishTracing measures what the relay's producer spans cost
// per message: the tracer's StartPublish and end around each publish batch
// of 500 messages of 200 bytes (the relay's default batch), with the
// OpenTelemetry SDK sampling 1% or 100% of them and exporting in batches
// over OTLP/HTTP to an in-process collector endpoint (which reads and
// drops the requests), as `outbox relay` does with
// OTEL_EXPORTER_OTLP_ENDPOINT. The batch processor blocks instead of
// dropping spans, so that every sampled span is exported and paid for. The
// messages carry no writer's trace (root spans), so the ratio applies;
// with a writer's trace the writer's decision applies (parent based).
//
// It reports the process's CPU µs per message (the tracer, the SDK's
// batch processor and exporter, and the collector endpoint's reading),
// and ns/msg of the publishing goroutine. Run with
//
//	go test -run '^$' -bench PublishTracing -benchtime 200x -count 5 ./tracing/otel/
func BenchmarkPublishTracing(b *testing.B) {
	var received atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		received.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	const batch = 500
	payload := []byte(strings.Repeat("x", 200))
	recs := make([]*outbox.Record, batch)
	for i := range recs {
		recs[i] = &outbox.Record{Message: outbox.Message{ID: outbox.NewID(), Topic: "orders.created", Key: fmt.Sprintf("k%d", i), Payload: payload, CreatedAt: time.Now()}}
	}
	errs := make([]error, batch)
	for _, ratio := range []float64{0.01, 1} {
		b.Run(fmt.Sprintf("sampled%gpct", ratio*100), func(b *testing.B) {
			exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
			if err != nil {
				b.Fatal(err)
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
			tracer := outboxtrace.NewPublishTracer("nats", outboxtrace.WithTracerProvider(tp))
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime(b)
			for range b.N {
				msgs, end := tracer.StartPublish(ctx, recs)
				if len(msgs) != batch {
					b.Fatal("StartPublish returned", len(msgs), "messages")
				}
				end(errs)
			}
			// The spans' export is part of the cost: flush it.
			if err := tp.Shutdown(context.Background()); err != nil {
				b.Fatal(err)
			}
			wall, cpu := time.Since(start), cpuTime(b)-cpu0
			b.StopTimer()
			msgs := float64(b.N * batch)
			b.ReportMetric(float64(cpu.Nanoseconds())/1000/msgs, "cpu-µs/msg")
			b.ReportMetric(float64(wall.Nanoseconds())/msgs, "ns/msg")
		})
	}
	if received.Load() == 0 {
		b.Fatal("the collector received no spans")
	}
}
