package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// flakyPublisher records first deliveries and fails a share of messages
// with a retryable error.
type flakyPublisher struct {
	failRate float64
	want     int           // first deliveries after which done is closed
	done     chan struct{} // closed after want first deliveries

	mu    sync.Mutex
	first map[string]bool  // message ID → delivered once
	order map[string][]int // key → per-key indexes in first-delivery order
	dups  int
}

func (p *flakyPublisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		if rand.Float64() < p.failRate {
			errs[i] = errors.New("flaky broker")
			continue
		}
		if p.first[m.ID] {
			p.dups++
			continue
		}
		p.first[m.ID] = true
		if len(p.first) == p.want {
			close(p.done)
		}
		key, idx, _ := strings.Cut(string(m.Payload), "/")
		n, _ := strconv.Atoi(idx)
		p.order[key] = append(p.order[key], n)
	}
	return errs
}

func (p *flakyPublisher) Close() error { return nil }

func (p *flakyPublisher) delivered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.first)
}

// TestRelayEndToEnd runs two relays on one table while a writer adds
// messages, with a publisher that fails one message in ten: nothing is
// lost and every key's messages are first published in write order.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 6, FetchDelay: 20 * time.Millisecond})
	const keys, perKey = 8, 20
	pub := &flakyPublisher{failRate: 0.1, want: keys * perKey, done: make(chan struct{}), first: map[string]bool{}, order: map[string][]int{}}
	cfg := outbox.Config{
		Workers: 2, BatchSize: 20, FetchSize: 40,
		PublishTimeout: time.Second, LeaseTTL: 3 * time.Second,
		PollInterval: 20 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		MaxAttempts: 1000, ShutdownTimeout: 10 * time.Second,
	}
	var relays []*outbox.Relay
	for i := range 2 {
		c := cfg
		c.Node = fmt.Sprintf("node-%d", i)
		r, err := outbox.NewRelay(s, pub, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	defer func() {
		for _, r := range relays {
			if err := r.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	}()

	ctx := ctxT(t)
	for i := range perKey {
		for k := range keys {
			m := &outbox.Message{Topic: "t.e2e", Key: fmt.Sprint("key", k), Payload: fmt.Appendf(nil, "key%d/%d", k, i)}
			if err := s.Write(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	select {
	case <-pub.done:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("delivered %d of %d messages within 60s", pub.delivered(), keys*perKey)
	}
	pub.mu.Lock()
	for k := range keys {
		got := pub.order[fmt.Sprint("key", k)]
		for i, n := range got {
			if n != i {
				t.Errorf("key%d first delivered in order %v, want 0..%d", k, got, perKey-1)
				break
			}
		}
	}
	pub.mu.Unlock()
	// Every message is settled: nothing outstanding once the relays have
	// settled their last batches.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		n, err := s.OutstandingCount(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still outstanding", n)
		}
	}
	pub.mu.Lock()
	dups := pub.dups
	pub.mu.Unlock()
	t.Logf("requests: %+v (duplicates published: %d)", s.Stats(), dups)
}
