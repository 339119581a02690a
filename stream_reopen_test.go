package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/sidetest"
)

// slowFetchStream is a stream store whose next fetch of one partition,
// once armed, waits until it is let go, then answers with what the store
// holds by then, whatever the fetch's deadline (as the WAL store's
// in-memory fetch does, slowed down on a loaded machine).
type slowFetchStream struct {
	*memstore.Stream
	part    int
	armed   atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (s *slowFetchStream) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if slices.ContainsFunc(cursors, func(c outbox.Cursor) bool { return c.Partition == s.part }) && s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.open
		ctx = context.WithoutCancel(ctx)
	}
	return s.Stream.Fetch(ctx, cursors, limit)
}

// flakyBroker delivers to a checker, except that: while down, Health
// fails; while blockA, topic "a" is refused as blocked; a publish to topic
// "b" answers only once holdB is closed (a broker slow to answer).
type flakyBroker struct {
	ch        *brokertest.Checker
	down      atomic.Bool
	blockA    atomic.Bool
	attemptsA atomic.Int64
	bEntered  chan struct{}
	bOnce     atomic.Bool
	holdB     chan struct{}
}

func (b *flakyBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		switch {
		case m.Topic == "a" && b.blockA.Load():
			b.attemptsA.Add(1)
			errs[i] = outbox.Blocked(m.Topic, errors.New("connection closed"))
			continue
		case m.Topic == "b":
			if b.bOnce.CompareAndSwap(false, true) {
				close(b.bEntered)
			}
			<-b.holdB
		}
		b.ch.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic})
	}
	return errs
}

func (b *flakyBroker) Health(context.Context) error {
	if b.down.Load() {
		return errors.New("not connected")
	}
	return nil
}

func (b *flakyBroker) Close() error { return nil }

// TestStreamPartitionHandedBackAndRetakenReadsItAgain: a relay cut off
// from its broker hands back one partition (drained) but not the other (a
// publish still in flight), so it keeps the stream; when the broker comes
// back it owns that partition again under the same epoch. A fetch of the
// partition issued before the hand-back and answered after the retake
// must not be applied to the new cursor: its records start past the
// records the first owner had queued and not published, which the new
// owner would then never read (they were published only by the next
// relay on the stream, after their key's later messages: the order
// violations of TestWALCrashTakeover/kinesis on a loaded machine).
func TestStreamPartitionHandedBackAndRetakenReadsItAgain(t *testing.T) {
	t.Parallel()
	st := &slowFetchStream{Stream: memstore.NewStream(2), entered: make(chan struct{}), open: make(chan struct{})}
	keyA, keyB := "", ""
	for i := 0; keyA == "" || keyB == ""; i++ {
		k := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if outbox.PartitionOf(k, 2) == 0 && keyA == "" {
			keyA = k
		} else if outbox.PartitionOf(k, 2) == 1 && keyB == "" {
			keyB = k
		}
	}
	st.part = outbox.PartitionOf(keyA, 2)
	ch := brokertest.NewChecker()
	pub := &flakyBroker{ch: ch, bEntered: make(chan struct{}), holdB: make(chan struct{})}
	write := func(topic, key string) string {
		t.Helper()
		m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key}
		ch.Written(key, m.ID)
		if err := st.Write(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	cfg := sidetest.Config("a")
	cfg.Workers, cfg.MaxAttempts = 1, 1000
	cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.PublishTimeout = 600*time.Millisecond, 50*time.Millisecond, 100*time.Millisecond
	r := relaytest.Start(t, st, pub, cfg)
	defer close(pub.holdB)

	// Partition B: a publish in flight that outlasts the outage.
	write("b", keyB)
	waitClosed(t, "the publish to B to start", pub.bEntered)
	// Partition A: its first message waits for its blocked destination,
	// and a fetch of the partition is slow to answer; a second message
	// of the key is written meanwhile.
	pub.blockA.Store(true)
	first := write("a", keyA)
	relaytest.WaitFor(t, "the first message of A refused as blocked", time.Minute, func() bool { return pub.attemptsA.Load() > 0 })
	st.armed.Store(true)
	waitClosed(t, "a fetch of partition A", st.entered)
	second := write("a", keyA)
	_, epoch := st.Holder()

	// The broker goes away for a lease TTL: partition A (nothing in
	// flight) is handed back, partition B (its publish in flight) is not,
	// so the relay keeps the stream; then the broker comes back, and the
	// relay owns A again under the same epoch.
	pub.down.Store(true)
	relaytest.WaitFor(t, "partition A handed back", time.Minute, func() bool { return r.Stats().Leases == 1 })
	pub.blockA.Store(false)
	pub.down.Store(false)
	relaytest.WaitFor(t, "partition A owned again", time.Minute, func() bool { return r.Stats().Leases == 2 })
	if h, e := st.Holder(); h != "a" || e != epoch {
		t.Fatalf("stream held by %q with epoch %d, want a with epoch %d (the scenario needs the same hold)", h, e, epoch)
	}

	// The slow fetch answers now, with the second message only.
	close(st.open)
	relaytest.WaitFor(t, "the second message of A published", time.Minute, func() bool {
		return !slices.Contains(ch.Verify().Lost, second)
	})
	rep := ch.Verify()
	if slices.Contains(rep.Lost, first) || len(rep.OrderViolations) > 0 {
		t.Fatalf("key %s: its second message was published, its first not before it: %v", keyA, rep)
	}
}

// waitClosed waits for c to be closed, failing the test after a minute.
func waitClosed(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}
