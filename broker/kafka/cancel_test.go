package kafka_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// A call cancelled while its records wait in a partition's buffer does
// not fail the records another call buffered behind them (franz-go fails a
// partition's buffered records together, by the context of the first):
// the other call produces them again and they are acknowledged. The
// broker holds the first produce request, so that the first call's
// records are still buffered when the second call's come and when the
// first is cancelled.
func TestAnotherCallsCancellationDoesNotFailThisCall(t *testing.T) {
	seeds, cluster := testenv.Kafka(t)
	topic := "cancel-behind"
	createTopic(t, seeds, prefixed(topic), 1)
	p := dial(t, kafka.Options{Brokers: seeds, TopicMapper: prefixed, MaxMessageBytes: 16 << 10})

	var held atomic.Bool
	release := make(chan struct{})
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if held.CompareAndSwap(false, true) {
			cluster.SleepControl(func() { <-release }) // the requests after it wait too
		}
		return nil, nil, false
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	batch := func(prefix string, n int) []*outbox.Message {
		msgs := make([]*outbox.Message, n)
		for i := range msgs {
			msgs[i] = &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: fmt.Sprintf("%s%d", prefix, i), Payload: []byte(strings.Repeat("x", 1024)), CreatedAt: time.Now()}
		}
		return msgs
	}
	waitBuffered := func(what string, cond func(int64) bool) int64 {
		deadline := time.Now().Add(30 * time.Second)
		for {
			if n := kafka.BufferedRecords(p); cond(n) {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d records buffered after 30s", what, kafka.BufferedRecords(p))
			}
			runtime.Gosched()
		}
	}

	first := batch("a", 500)
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	doneA := make(chan []error, 1)
	go func() { doneA <- p.Publish(ctxA, first) }()
	waitBuffered("the first call's records", func(n int64) bool { return n == int64(len(first)) && held.Load() })

	second := batch("b", 10)
	ctxB, cancelB := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelB()
	doneB := make(chan []error, 1)
	go func() { doneB <- p.Publish(ctxB, second) }()
	waitBuffered("the second call's records", func(n int64) bool { return n == int64(len(first)+len(second)) })

	cancelA()
	<-doneA // returns at once, its records still buffered
	close(release)
	released = true
	for i, err := range <-doneB {
		if err != nil {
			t.Fatalf("second call, message %d: %v", i, err)
		}
	}
}
