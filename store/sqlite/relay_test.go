package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
)

// recorder is a publisher that records every message it receives in a
// Checker, in call order, and signals each call.
type recorder struct {
	c      *brokertest.Checker
	called chan struct{}
}

func (r *recorder) Publish(_ context.Context, msgs []*outbox.Message) []error {
	for _, m := range msgs {
		r.c.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic, Payload: m.Payload})
	}
	select {
	case r.called <- struct{}{}:
	default:
	}
	return make([]error, len(msgs))
}

func (r *recorder) Close() error { return nil }

// TestRelayNodes drains the SQLite store with three relay nodes in one
// process through a publisher that fails and loses acknowledgements at
// random, while writers keep writing; one node stops half way and the
// others take its partitions over. Nothing is lost and each key's messages
// are first published in commit order.
func TestRelayNodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	checker := brokertest.NewChecker()
	rec := &recorder{c: checker, called: make(chan struct{}, 1)}
	pub := &brokertest.Chaos{Inner: rec, FailRate: 0.05, BatchFailRate: 0.02, LostAckRate: 0.02, MaxLatency: 2 * time.Millisecond, Seed: 1}
	newRelay := func(node string) *outbox.Relay {
		r, err := outbox.NewRelay(b.store, pub, outbox.Config{
			Node:           node,
			Workers:        2,
			BatchSize:      50,
			PublishTimeout: time.Second,
			LeaseTTL:       3 * time.Second,
			BackoffMin:     5 * time.Millisecond,
			BackoffMax:     50 * time.Millisecond,
			MaxAttempts:    1000,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop() })
		return r
	}
	relays := []*outbox.Relay{newRelay("a"), newRelay("b"), newRelay("c")}

	// Each key has one writer, so the order of its commits is the order in
	// which the writer records them.
	const writers, keysPerWriter, perWriter = 3, 4, 150
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				key := fmt.Sprintf("key-%d-%d", w, i%keysPerWriter)
				id := outbox.NewID()
				if err := b.write(t, outbox.Message{ID: id, Topic: "orders.created", Key: key, Payload: []byte(fmt.Sprint(i))}); err != nil {
					errs <- err
					return
				}
				checker.Written(key, id)
			}
		}()
	}

	stopped := false
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		rep := checker.Verify()
		if !stopped && rep.DeliveredUnique >= writers*perWriter/2 {
			if err := relays[0].Stop(); err != nil {
				t.Fatalf("stop node a: %v", err)
			}
			stopped = true
		}
		// Drained: every message delivered and settled. (Delivered is not
		// enough: a message whose acknowledgement the chaos publisher lost
		// is on the broker but waits for its retry in the outbox, and Stop
		// does not publish what waits.)
		if rep.Written == writers*perWriter && rep.DeliveredUnique == rep.Written && b.count(t, "_messages") == 0 {
			break
		}
		select {
		case <-rec.called:
		case <-time.After(20 * time.Millisecond): // settles signal nothing: look again
		case err := <-errs:
			t.Fatalf("writer: %v", err)
		case <-deadline.C:
			t.Fatalf("not every message published within a minute: %v", rep)
		}
	}
	wg.Wait()
	for _, r := range relays {
		if err := r.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	rep := checker.Verify()
	t.Logf("%v; chaos: %+v", rep, pub.Stats())
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rep.OrderViolations) > 0 {
		t.Fatalf("order violations: %v", rep.OrderViolations)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages left in the outbox", n)
	}
}
