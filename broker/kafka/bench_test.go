package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
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
