package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/sidetest"
)

// streamWrite writes n transactions of 10 messages over 20 keys and
// records them in ch.
func streamWrite(t *testing.T, st *memstore.Stream, ch *brokertest.Checker, txns int, tag string) {
	t.Helper()
	for i := range txns {
		var msgs []outbox.Message
		for j := range 10 {
			m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprint("k", (i*10+j)%20), Payload: []byte(tag)}
			msgs = append(msgs, m)
			ch.Written(m.Topic+"|"+m.Key, m.ID)
		}
		if err := st.Write(t.Context(), msgs...); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamOneRelayHoldsTheNextTakesOver: two relays on one stream: one
// holds it with every partition while the other stands by with none; when
// the holder stops, the other takes the stream over at once (the store's
// channel, not its next round: HeartbeatInterval is a minute here) and
// publishes the rest, nothing lost, nothing out of order, and nothing the
// first one acknowledged published again.
func TestStreamOneRelayHoldsTheNextTakesOver(t *testing.T) {
	t.Parallel()
	st := memstore.NewStream(8)
	ch := brokertest.NewChecker()
	pub := sidetest.NewBroker(ch)
	cfgA, cfgB := sidetest.Config("a"), sidetest.Config("b")
	cfgA.HeartbeatInterval, cfgB.HeartbeatInterval = time.Minute, time.Minute
	cfgA.LeaseTTL, cfgB.LeaseTTL = 3*time.Minute, 3*time.Minute
	streamWrite(t, st, ch, 30, "before")
	a := relaytest.Start(t, st, pub, cfgA)
	relaytest.WaitFor(t, "a to hold the stream and publish", time.Minute, func() bool {
		h, _ := st.Holder()
		return h == "a" && a.Stats().Published > 0
	})
	b := relaytest.Start(t, st, pub, cfgB)
	relaytest.WaitFor(t, "b to be ready", time.Minute, b.Ready)
	if h, _ := st.Holder(); h != "a" {
		t.Fatalf("holder %q after b started, want a", h)
	}
	if n := b.Stats().Leases; n != 0 {
		t.Fatalf("b owns %d partitions while a holds the stream, want 0", n)
	}
	streamWrite(t, st, ch, 30, "during")
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "b to take the stream over", 30*time.Second, func() bool {
		h, _ := st.Holder()
		return h == "b" && b.Stats().Leases == 8
	})
	streamWrite(t, st, ch, 30, "after")
	relaytest.WaitFor(t, "every message published", time.Minute, func() bool { return len(ch.Verify().Lost) == 0 })
	rep := ch.Verify()
	if len(rep.OrderViolations) > 0 || len(rep.Unknown) > 0 || len(rep.WrongKey) > 0 {
		t.Fatal(rep)
	}
	if len(rep.Duplicates) > 0 || st.ReadAgain() > 0 {
		t.Fatalf("%d messages published twice, %d read again after a's clean stop", len(rep.Duplicates), st.ReadAgain())
	}
}

// unreachable is a broker that cannot be reached: Health and every
// Publish fail.
type unreachable struct{ calls atomic.Int64 }

var errUnreachable = errors.New("dial tcp 127.0.0.1:4222: connection refused")

func (u *unreachable) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	u.calls.Add(1)
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = errUnreachable
	}
	return errs
}
func (u *unreachable) Health(ctx context.Context) error { return errUnreachable }
func (u *unreachable) Close() error                     { return nil }

// TestStreamCutOffRelayHandsTheStreamOver: the relay holding the stream
// cannot reach its broker for a lease TTL: it releases the stream (once
// what it has in flight is settled), a relay that can publish takes it
// over and publishes everything, and the cut-off relay does not ask for
// it again while its broker stays unreachable.
func TestStreamCutOffRelayHandsTheStreamOver(t *testing.T) {
	t.Parallel()
	st := memstore.NewStream(8)
	ch := brokertest.NewChecker()
	streamWrite(t, st, ch, 20, "x")
	cfgA := sidetest.Config("a")
	cfgA.MaxAttempts = 1000 // the failures are the broker's: nothing to dead-letter
	down := &unreachable{}
	a := relaytest.Start(t, st, down, cfgA)
	relaytest.WaitFor(t, "a to hold the stream and try to publish", time.Minute, func() bool {
		h, _ := st.Holder()
		return h == "a" && down.calls.Load() > 0
	})
	b := relaytest.Start(t, st, sidetest.NewBroker(ch), sidetest.Config("b"))
	relaytest.WaitFor(t, "b to take the stream over from the cut-off relay", time.Minute, func() bool {
		h, _ := st.Holder()
		return h == "b"
	})
	relaytest.WaitFor(t, "every message published", time.Minute, func() bool { return len(ch.Verify().Lost) == 0 })
	if rep := ch.Verify(); len(rep.OrderViolations) > 0 || len(rep.Unknown) > 0 {
		t.Fatal(rep)
	}
	if n := a.Stats().Leases; n != 0 {
		t.Fatalf("the cut-off relay owns %d partitions, want 0", n)
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	// b let go; a is still cut off: it must not take the stream.
	streamWrite(t, st, ch, 1, "y")
	if h, _ := st.Holder(); h != "" {
		t.Fatalf("holder %q after b stopped while a is cut off, want none", h)
	}
	if len(st.Dead()) != 0 {
		t.Fatalf("%d dead letters", len(st.Dead()))
	}
}
