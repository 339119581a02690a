package rabbitmq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Publish throughput with batches of 500 messages of 200 bytes, the relay's
// default batch size, into a durable classic or quorum queue, persistent
// messages, with one caller and with four concurrent callers (the relay's
// default worker count). Run with
//
//	go test -run '^$' -bench . -benchtime 20x ./broker/rabbitmq/
func BenchmarkPublish(b *testing.B) {
	for _, queueType := range []string{"classic", "quorum"} {
		for _, callers := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/batch500x200B/callers%d", queueType, callers), func(b *testing.B) {
				benchPublish(b, queueType, 500, 200, callers)
			})
		}
	}
}

func benchPublish(b *testing.B, queueType string, batch, size, callers int) {
	p := dial(b, rabbitmq.Options{})
	topic := "rmq." + testenv.Name(b)
	queueFor(b, queueType, rabbitmq.ExchangeDefault, topic, nil)
	payload := []byte(strings.Repeat("x", size))
	batches := make([][]*outbox.Message, callers)
	for c := range batches {
		batches[c] = make([]*outbox.Message, batch)
		for i := range batches[c] {
			batches[c][i] = &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: fmt.Sprintf("k%d", i), Payload: payload, CreatedAt: time.Now()}
		}
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var next sync.Mutex
	n := 0
	for c := range callers {
		wg.Go(func() {
			for {
				next.Lock()
				if n >= b.N {
					next.Unlock()
					return
				}
				n++
				next.Unlock()
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

// BenchmarkRawAMQP is the baseline: the same batches published with
// amqp091-go directly (one channel, pipelined, then waiting for every
// confirm), to show the Publisher's overhead.
func BenchmarkRawAMQP(b *testing.B) {
	for _, queueType := range []string{"classic", "quorum"} {
		b.Run(queueType+"/batch500x200B", func(b *testing.B) {
			dial(b, rabbitmq.Options{}) // declares the exchange
			topic := "rmq." + testenv.Name(b)
			queueFor(b, queueType, rabbitmq.ExchangeDefault, topic, nil)
			ch := admin(b)
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			pub := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(strings.Repeat("x", 200))}
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				dcs := make([]*amqp.DeferredConfirmation, 500)
				for i := range dcs {
					pub.MessageId = outbox.NewID()
					dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, rabbitmq.ExchangeDefault, topic, true, false, pub)
					if err != nil {
						b.Fatal(err)
					}
					dcs[i] = dc
				}
				for _, dc := range dcs {
					if !dc.Wait() {
						b.Fatal("nack")
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*500)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
