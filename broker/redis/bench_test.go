package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish throughput with batches of 500 messages of 200 bytes (the relay's
// default batch size) to one stream of a redis-server started for the
// benchmark (appendonly yes, appendfsync always: every reply after the
// write reached the disk), with one caller and four concurrent callers
// (the relay's default worker count). Run with
//
//	go test -run '^$' -bench Publish -benchtime 100x -count 3 ./broker/redis/
func BenchmarkPublish(b *testing.B) {
	s := testenv.Redis(b, testenv.RedisOptions{})
	c := client(b, s)
	createStream(b, c, "bench")
	p := dial(b, redis.Options{Addr: s.Addr()})
	for _, callers := range []int{1, 4} {
		b.Run(fmt.Sprintf("batch500x200B/callers%d", callers), func(b *testing.B) {
			payload := []byte(strings.Repeat("x", 200))
			batches := make([][]*outbox.Message, callers)
			for ci := range batches {
				for i := range 500 {
					batches[ci] = append(batches[ci], &outbox.Message{ID: outbox.NewID(), Topic: "bench", Key: fmt.Sprintf("c%d-k%d", ci, i), Payload: payload, CreatedAt: time.Now()})
				}
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			n := 0
			for ci := range callers {
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
						errs := p.Publish(ctx, batches[ci])
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
			b.ReportMetric(float64(b.N*500)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// The relay (ordering key, 4 workers, batches of 500) draining a backlog of
// 20,000 messages of 200 bytes over 1,000 keys from an in-memory store to
// one stream. Run with
//
//	go test -run '^$' -bench RelayDrain -benchtime 3x -count 3 ./broker/redis/
func BenchmarkRelayDrain(b *testing.B) {
	s := testenv.Redis(b, testenv.RedisOptions{})
	c := client(b, s)
	createStream(b, c, "drain")
	pub := dial(b, redis.Options{Addr: s.Addr()})
	payload := []byte(strings.Repeat("x", 200))
	const n = 20000
	var total time.Duration
	for range b.N {
		b.StopTimer()
		st := memstore.New(64, nil)
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: "drain", Key: fmt.Sprintf("k%d", i%1000), Payload: payload}
		}
		if err := st.Write(context.Background(), msgs...); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		r := relaytest.Start(b, st, pub, outbox.Config{PollInterval: 10 * time.Millisecond})
		relaytest.WaitFor(b, "the drain", time.Minute, func() bool { return st.Outstanding() == 0 })
		total += time.Since(start)
		b.StopTimer()
		if err := r.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/total.Seconds(), "msgs/s")
}
