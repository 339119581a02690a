package natsjs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// BenchmarkPublish publishes batches of 500 messages of 200 bytes, each with
// its own key, to a file-storage stream of an embedded server, from 1 and
// from 4 concurrent callers, and reports messages per second.
//
//	go test -run '^$' -bench PublishBatch -benchtime 3s ./broker/natsjs/
func BenchmarkPublishBatch500x200B(b *testing.B) {
	for _, callers := range []int{1, 4} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			benchPublish(b, 500, 200, callers)
		})
	}
}

// BenchmarkRawAsyncPublishBatch500x200B is the baseline: the same batches
// published with nats.go's PublishMsgAsync and PublishAsyncComplete directly,
// without the Publisher's per-message results, bound and classification.
func BenchmarkRawAsyncPublishBatch500x200B(b *testing.B) {
	srv := testenv.NATS(b)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsjs.MaxInFlightDefault))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "bench", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage, MaxMsgs: 1_000_000}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 200)
	var published int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		msgs := make([]*nats.Msg, 500)
		for i := range msgs {
			msgs[i] = &nats.Msg{Subject: "bench.orders", Data: payload, Header: nats.Header{
				jetstream.MsgIDHeader: {outbox.NewID()}, outbox.HeaderKey: {fmt.Sprint("k", i)},
			}}
		}
		b.StartTimer()
		start := time.Now()
		for _, m := range msgs {
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		elapsed += time.Since(start)
		published += len(msgs)
	}
	b.ReportMetric(float64(published)/elapsed.Seconds(), "msgs/s")
}

func benchPublish(b *testing.B, batch, size, callers int) {
	srv := testenv.NATS(b)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "bench",
		Subjects: []string{"bench.>"},
		Storage:  jetstream.FileStorage,
		MaxMsgs:  1_000_000, // bounds the disk used by long runs
	}); err != nil {
		b.Fatal(err)
	}
	p, err := natsjs.Dial(srv.ClientURL(), natsjs.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	payload := make([]byte, size)
	// Messages are built outside the timed loop; re-publishing one ID is
	// de-duplicated by the stream, so each round gets fresh IDs.
	batches := func() [][]*outbox.Message {
		out := make([][]*outbox.Message, callers)
		for c := range out {
			out[c] = make([]*outbox.Message, batch)
			for i := range out[c] {
				out[c][i] = &outbox.Message{ID: outbox.NewID(), Topic: "bench.orders", Key: fmt.Sprintf("c%d-k%d", c, i), Payload: payload, CreatedAt: time.Now()}
			}
		}
		return out
	}
	var published int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		round := batches()
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for _, msgs := range round {
			wg.Go(func() {
				for i, err := range p.Publish(ctx, msgs) {
					if err != nil {
						b.Errorf("message %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		elapsed += time.Since(start)
		published += batch * callers
	}
	b.ReportMetric(float64(published)/elapsed.Seconds(), "msgs/s")
}
