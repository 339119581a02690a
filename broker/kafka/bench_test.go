package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish throughput with batches of 500 messages of 200 bytes (the relay's
// default batch size) to a topic of 8 partitions of an in-process kfake
// cluster of 3 brokers, with one caller and with four concurrent callers
// (the relay's default worker count). kfake runs in the same process, so
// this measures the client and the fake broker together. Run with
//
//	go test -run '^$' -bench . -benchtime 100x ./broker/kafka/
func BenchmarkPublish(b *testing.B) {
	for _, linger := range []time.Duration{0, 10 * time.Millisecond} {
		for _, callers := range []int{1, 4} {
			b.Run(fmt.Sprintf("batch500x200B/linger%v/callers%d", linger, callers), func(b *testing.B) {
				benchPublish(b, 500, 200, callers, linger)
			})
		}
	}
}

func benchPublish(b *testing.B, batch, size, callers int, linger time.Duration) {
	seeds, _ := testenv.Kafka(b)
	createTopic(b, seeds, "bench", 8)
	p := dial(b, kafka.Options{Brokers: seeds, Linger: linger})
	payload := []byte(strings.Repeat("x", size))
	batches := make([][]*outbox.Message, callers)
	for c := range batches {
		batches[c] = make([]*outbox.Message, batch)
		for i := range batches[c] {
			batches[c][i] = &outbox.Message{ID: outbox.NewID(), Topic: "bench", Key: fmt.Sprintf("c%d-k%d", c, i), Payload: payload, CreatedAt: time.Now()}
		}
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for c := range callers {
		wg.Go(func() {
			for {
				mu.Lock()
				if n >= b.N {
					mu.Unlock()
					return
				}
				n++
				mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				errs := p.Publish(ctx, batches[c])
				cancel()
				for _, err := range errs {
					if err != nil {
						b.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "msgs/s")
}

// The relay (ordering key, 4 workers, batches of 500) draining a backlog of
// 20,000 messages of 200 bytes over 10, 100 or 1,000 keys from an
// in-memory store to a topic of 16 partitions of an in-process kfake
// cluster, with Options.KeyPipeline 1 (one message per key per call) and 8.
// Each iteration drains a fresh backlog. Run with
//
//	go test -run '^$' -bench RelayKeyPipeline -benchtime 3x -count 3 ./broker/kafka/
func BenchmarkRelayKeyPipeline(b *testing.B) {
	seeds, _ := testenv.Kafka(b)
	for _, keys := range []int{10, 100, 1000} {
		for _, kp := range []int{1, 8} {
			b.Run(fmt.Sprintf("keys%d/pipeline%d", keys, kp), func(b *testing.B) {
				topic := fmt.Sprintf("relaybench-%d-%d-%s", keys, kp, outbox.NewID()) // b.Run calls this more than once
				createTopic(b, seeds, topic, 16)
				pub := dial(b, kafka.Options{Brokers: seeds, KeyPipeline: kp})
				payload := []byte(strings.Repeat("x", 200))
				const n = 20000
				var total time.Duration
				var calls int64
				for range b.N {
					b.StopTimer()
					st := memstore.New(64, nil)
					msgs := make([]outbox.Message, n)
					for i := range msgs {
						msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: topic, Key: fmt.Sprintf("k%d", i%keys), Payload: payload}
					}
					if err := st.Write(context.Background(), msgs...); err != nil {
						b.Fatal(err)
					}
					counted := &callCounter{Publisher: pub}
					b.StartTimer()
					start := time.Now()
					r := relaytest.Start(b, st, counted, outbox.Config{PollInterval: 10 * time.Millisecond})
					relaytest.WaitFor(b, "the drain", time.Minute, func() bool { return st.Outstanding() == 0 })
					total += time.Since(start)
					b.StopTimer()
					if err := r.Stop(); err != nil {
						b.Fatal(err)
					}
					calls += counted.calls.Load()
				}
				b.ReportMetric(float64(b.N*n)/total.Seconds(), "msgs/s")
				b.ReportMetric(float64(b.N*n)/float64(calls), "msgs/call")
			})
		}
	}
}

// callCounter counts Publish calls.
type callCounter struct {
	*kafka.Publisher
	calls atomic.Int64
}

func (c *callCounter) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	c.calls.Add(1)
	return c.Publisher.Publish(ctx, msgs)
}
