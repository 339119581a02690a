// Package relaytest holds relay scenarios that run against any store: the
// engine's own tests run them on an in-memory store, internal/e2e on
// PostgreSQL.
package relaytest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// Harness gives a scenario a fresh store with P = 2 partitions.
type Harness struct {
	Store outbox.Store
	// Write commits msgs in one transaction.
	Write func(ctx context.Context, msgs ...outbox.Message) error
	// Outstanding counts the unpublished messages.
	Outstanding func() int64
	// Owner returns the node holding partition p's lease ("" if none).
	Owner func(p int) string
	// DeadLetters counts the dead letters.
	DeadLetters func() int64
}

// Cut wraps a store and makes the heartbeat and lease calls of one relay
// fail while set: a relay that stops heartbeating (a network partition, a
// stalled process) but may still settle when it wakes up.
type Cut struct {
	outbox.Store
	cut atomic.Bool
}

var errCut = errors.New("relaytest: network partition")

func (c *Cut) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	return c.Store.Heartbeat(ctx, node, ttl)
}

func (c *Cut) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.AcquireLeases(ctx, node, held, want, ttl)
}

// Gate is a publisher that blocks every Publish until Open is called,
// whatever the caller's deadline (a broker answering late), then
// acknowledges everything. Entered receives a value when a call arrives.
type Gate struct {
	Entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func NewGate() *Gate { return &Gate{Entered: make(chan struct{}, 1), gate: make(chan struct{})} }

func (g *Gate) Open() { g.once.Do(func() { close(g.gate) }) }

func (g *Gate) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	select {
	case g.Entered <- struct{}{}:
	default:
	}
	<-g.gate
	return make([]error, len(msgs))
}

func (g *Gate) Close() error { return nil }

// Recorder acknowledges everything and records the IDs in order.
type Recorder struct {
	mu  sync.Mutex
	ids []string
}

func (r *Recorder) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.ids = append(r.ids, m.ID)
	}
	return make([]error, len(msgs))
}

func (r *Recorder) Close() error { return nil }

// IDs returns the IDs published so far.
func (r *Recorder) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids...)
}

// WaitFor polls cond until it holds or d passes.
func WaitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not synchronising
	}
}

// LeaseTakeover: relay a stops heartbeating while a publish is stuck at
// its broker; relay b must take its partitions over within the lease TTL
// (plus a heartbeat) and publish the message; when a's broker finally
// answers, a's settle must be fenced off and change nothing.
func LeaseTakeover(t *testing.T, h Harness) {
	cut := &Cut{Store: h.Store}
	slow := NewGate()
	defer slow.Open()
	cfg := outbox.Config{
		Node: "a", Workers: 1, BatchSize: 10,
		LeaseTTL: 600 * time.Millisecond, PublishTimeout: 150 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}
	a, err := outbox.NewRelay(cut, slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	WaitFor(t, "a to hold both partitions", 10*time.Second, func() bool { return a.Stats().Leases == 2 })

	msg := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := h.Write(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	<-slow.Entered // a is publishing msg and stuck at its broker
	cut.cut.Store(true)
	start := time.Now()

	fast := &Recorder{}
	cfg.Node = "b"
	b, err := outbox.NewRelay(h.Store, fast, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	WaitFor(t, "b to take both partitions over", 10*time.Second, func() bool { return b.Stats().Leases == 2 })
	// The lease bound: a takeover before the lease could expire would be a
	// fencing bug; one long after it, a lease that was never given up.
	// (Generous: a loaded CI machine delays heartbeats.)
	took := time.Since(start)
	if took > 3*cfg.LeaseTTL {
		t.Errorf("takeover took %v; the lease TTL is %v", took, cfg.LeaseTTL)
	}
	// a renewed at most one heartbeat before the cut, so its leases ran at
	// least TTL - heartbeat after it: b must not have had them sooner.
	if took < cfg.LeaseTTL-2*cfg.HeartbeatInterval {
		t.Errorf("b took the partitions %v after a stopped heartbeating, before a's lease (TTL %v) could expire", took, cfg.LeaseTTL)
	}
	WaitFor(t, "b to publish and settle the message", 10*time.Second, func() bool { return h.Outstanding() == 0 })
	if ids := fast.IDs(); len(ids) != 1 || ids[0] != msg.ID {
		t.Fatalf("b published %v, want [%s]", ids, msg.ID)
	}
	p := outbox.PartitionOf(msg.Key, 2)
	if owner := h.Owner(p); owner != "b" {
		t.Fatalf("owner of partition %d = %q, want b", p, owner)
	}
	// a's broker answers only now: a settles under its old epoch and must be
	// fenced off, leaving b's lease and the store untouched.
	later := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	slow.Open()
	WaitFor(t, "a's late settle to be fenced", 10*time.Second, func() bool { return a.Stats().Fenced > 0 })
	if owner := h.Owner(p); owner != "b" {
		t.Fatalf("owner of partition %d = %q after a's late settle, want b", p, owner)
	}
	if n := h.DeadLetters(); n != 0 {
		t.Fatalf("a fenced relay changed the store: %d dead letters", n)
	}
	// b goes on publishing the key.
	if err := h.Write(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, "b to publish the next message", 10*time.Second, func() bool { return h.Outstanding() == 0 })
	if ids := fast.IDs(); ids[len(ids)-1] != later.ID {
		t.Fatalf("b published %v last, want %s", ids[len(ids)-1], later.ID)
	}
}
