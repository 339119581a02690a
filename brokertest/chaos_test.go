package brokertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// memBroker is an in-memory publisher that stores what it acknowledges, in
// order, so that the tests can see what reached "the broker".
type memBroker struct {
	mu     sync.Mutex
	stored []*outbox.Message
	fail   error // if set, every message fails with it and is not stored
}

func (b *memBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		switch {
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		case b.fail != nil:
			errs[i] = b.fail
		default:
			b.stored = append(b.stored, m)
		}
	}
	return errs
}

func (b *memBroker) Close() error { return nil }

func (b *memBroker) storedIDs() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := map[string]int{}
	for _, m := range b.stored {
		ids[m.ID]++
	}
	return ids
}

func chaosBatch(n int) []*outbox.Message {
	return newBatch("chaos.test", n, func(i int) string { return fmt.Sprintf("k%d", i) })
}

func TestChaosNoChaosPassesThrough(t *testing.T) {
	b := &memBroker{}
	c := &Chaos{Inner: b}
	msgs := chaosBatch(100)
	requireAllOK(t, msgs, c.Publish(context.Background(), msgs))
	if got := len(b.storedIDs()); got != 100 {
		t.Fatalf("broker stored %d messages; want 100", got)
	}
	want := ChaosStats{Calls: 1, Messages: 100, Forwarded: 100}
	if s := c.Stats(); s != want {
		t.Fatalf("Stats() = %+v; want %+v", s, want)
	}
	if errs := c.Publish(context.Background(), nil); len(errs) != 0 {
		t.Fatalf("Publish(nil) returned %d results", len(errs))
	}
}

func TestChaosFailBefore(t *testing.T) {
	b := &memBroker{}
	c := &Chaos{Inner: b, FailRate: 1}
	msgs := chaosBatch(10)
	errs := c.Publish(context.Background(), msgs)
	for i, err := range errs {
		if !errors.Is(err, ErrInjected) || outbox.IsPermanent(err) {
			t.Fatalf("message %d: %v; want a retryable error wrapping ErrInjected", i, err)
		}
	}
	if got := len(b.storedIDs()); got != 0 {
		t.Fatalf("broker stored %d messages failed before publishing; want 0", got)
	}

	c = &Chaos{Inner: b, FailRate: 1, PermanentRate: 1}
	for i, err := range c.Publish(context.Background(), msgs) {
		if !errors.Is(err, ErrInjected) || !outbox.IsPermanent(err) {
			t.Fatalf("message %d: %v; want a permanent error wrapping ErrInjected", i, err)
		}
	}
	if s := c.Stats(); s.FailedBefore != 10 || s.Permanent != 10 || s.Forwarded != 0 {
		t.Fatalf("Stats() = %+v; want 10 failed before, 10 permanent, none forwarded", s)
	}
}

func TestChaosBatchFail(t *testing.T) {
	b := &memBroker{}
	c := &Chaos{Inner: b, BatchFailRate: 1}
	for i, err := range c.Publish(context.Background(), chaosBatch(10)) {
		if !errors.Is(err, ErrInjected) {
			t.Fatalf("message %d: %v; want ErrInjected", i, err)
		}
	}
	if got := len(b.storedIDs()); got != 0 {
		t.Fatalf("broker stored %d messages of a failed batch; want 0", got)
	}
}

func TestChaosLostAck(t *testing.T) {
	for _, c := range []*Chaos{{LostAckRate: 1}, {BatchLostAckRate: 1}} {
		b := &memBroker{}
		c.Inner = b
		msgs := chaosBatch(10)
		for i, err := range c.Publish(context.Background(), msgs) {
			if !errors.Is(err, ErrInjected) || outbox.IsPermanent(err) {
				t.Fatalf("message %d: %v; want a retryable ErrInjected", i, err)
			}
		}
		if got := len(b.storedIDs()); got != 10 {
			t.Fatalf("broker stored %d messages; want all 10 (the acknowledgements were lost, not the messages)", got)
		}
		if s := c.Stats(); s.LostAcks != 10 {
			t.Fatalf("Stats().LostAcks = %d; want 10", s.LostAcks)
		}
	}
}

func TestChaosInnerErrorsPassThrough(t *testing.T) {
	innerErr := outbox.Permanent(errors.New("no such stream"))
	c := &Chaos{Inner: &memBroker{fail: innerErr}, LostAckRate: 1}
	for i, err := range c.Publish(context.Background(), chaosBatch(5)) {
		if err != innerErr {
			t.Fatalf("message %d: %v; want the inner error unchanged", i, err)
		}
	}
}

// TestChaosRates checks the injected proportions and that exactly the
// messages reported nil, plus the lost acknowledgements, reached the broker.
func TestChaosRates(t *testing.T) {
	b := &memBroker{}
	c := &Chaos{Inner: b, FailRate: 0.2, LostAckRate: 0.1, Seed: 42}
	var nilIDs, failedIDs []string
	for range 100 {
		msgs := chaosBatch(100)
		for i, err := range c.Publish(context.Background(), msgs) {
			if err == nil {
				nilIDs = append(nilIDs, msgs[i].ID)
			} else {
				failedIDs = append(failedIDs, msgs[i].ID)
			}
		}
	}
	s := c.Stats()
	if f := float64(s.FailedBefore) / 10000; f < 0.17 || f > 0.23 {
		t.Errorf("%.3f of the messages failed before the broker; want about 0.2", f)
	}
	if f := float64(s.LostAcks) / float64(s.Forwarded); f < 0.08 || f > 0.12 {
		t.Errorf("%.3f of the forwarded messages lost their acknowledgement; want about 0.1", f)
	}
	stored := b.storedIDs()
	for _, id := range nilIDs {
		if stored[id] != 1 {
			t.Fatalf("message %s was reported published but stored %d times", id, stored[id])
		}
	}
	if got, want := len(stored), len(nilIDs)+int(s.LostAcks); got != want {
		t.Fatalf("broker stored %d messages; want %d acknowledged + %d lost acknowledgements", got, len(nilIDs), s.LostAcks)
	}
	if s.Forwarded != int64(len(stored)) {
		t.Fatalf("Stats().Forwarded = %d; the broker stored %d", s.Forwarded, len(stored))
	}
}

func TestChaosSeedIsReproducible(t *testing.T) {
	pattern := func() string {
		c := &Chaos{Inner: &memBroker{}, FailRate: 0.3, LostAckRate: 0.3, BatchFailRate: 0.1, Seed: 7}
		var s []byte
		for range 20 {
			for _, err := range c.Publish(context.Background(), chaosBatch(20)) {
				s = append(s, map[bool]byte{true: '.', false: 'x'}[err == nil])
			}
		}
		return string(s)
	}
	if a, b := pattern(), pattern(); a != b {
		t.Fatalf("two runs with the same seed differ:\n%s\n%s", a, b)
	}
}

func TestChaosLatencyHonoursContext(t *testing.T) {
	b := &memBroker{}
	c := &Chaos{Inner: b, MaxLatency: time.Hour, Seed: 1}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := publishWithin(t, c, ctx, chaosBatch(10), 10*time.Second)
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("message %d: %v; want context.Canceled", i, err)
		}
	}
	if got := len(b.storedIDs()); got != 0 {
		t.Fatalf("broker stored %d messages; want none", got)
	}
}

// TestChaosWithChecker runs a minimal relay loop (per key, publish the head
// message until it is acknowledged, then the next) through Chaos, from 8
// goroutines, and checks with a Checker that nothing is lost, per-key order
// holds, and every duplicate comes from a lost acknowledgement.
func TestChaosWithChecker(t *testing.T) {
	const workers, keysPerWorker, perKey = 8, 10, 20
	b := &memBroker{}
	c := &Chaos{Inner: b, FailRate: 0.2, BatchFailRate: 0.05, LostAckRate: 0.1, BatchLostAckRate: 0.02, MaxLatency: time.Millisecond, Seed: 3}
	chk := NewChecker()
	var wg sync.WaitGroup
	for w := range workers {
		// Each worker owns its keys, as a relay owns its partitions.
		queues := make([][]*outbox.Message, keysPerWorker)
		for i := range perKey {
			for k := range queues {
				m := newMessage("chaos.test", fmt.Sprintf("w%d-k%d", w, k), fmt.Appendf(nil, "%d", i))
				chk.Written(m.Key, m.ID)
				queues[k] = append(queues[k], m)
			}
		}
		wg.Go(func() {
			for {
				var batch []*outbox.Message
				var from []int
				for k, q := range queues {
					if len(q) > 0 {
						batch = append(batch, q[0])
						from = append(from, k)
					}
				}
				if len(batch) == 0 {
					return
				}
				for i, err := range c.Publish(context.Background(), batch) {
					if err == nil {
						queues[from[i]] = queues[from[i]][1:]
					}
				}
			}
		})
	}
	wg.Wait()
	b.mu.Lock()
	for _, m := range b.stored {
		chk.Delivered(Received{ID: m.ID, Key: m.Key, Topic: m.Topic})
	}
	b.mu.Unlock()
	r := chk.Verify()
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if int64(len(r.Duplicates)) != s.LostAcks {
		t.Fatalf("%d duplicates; want one per lost acknowledgement (%d)", len(r.Duplicates), s.LostAcks)
	}
	if s.FailedBefore == 0 || s.LostAcks == 0 {
		t.Fatalf("Stats() = %+v: the chaos did not inject both kinds of failure", s)
	}
	t.Logf("%v; chaos %+v", r, s)
}
