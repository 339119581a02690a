package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// These tests pin down paths a review found to publish twice without a
// crash or a lost acknowledgement, to reorder a key, or to stall.

// keyFor returns a key of partition p of n.
func keyFor(p, n int) string {
	for i := 0; ; i++ {
		if k := fmt.Sprint("key", i); outbox.PartitionOf(k, n) == p {
			return k
		}
	}
}

// BatchSize 1 and FetchSize 1 are valid: the relay must still fetch (it
// used to ask for FetchSize/2 = 0 records, and got none, forever).
func TestRelayFetchSizeOne(t *testing.T) {
	st := memstore.New(2, nil)
	b := &broker{}
	cfg := fastConfig()
	cfg.BatchSize, cfg.FetchSize = 1, 1
	startRelay(t, st, b, cfg)
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message to be published", 10*time.Second, func() bool { return st.Outstanding() == 0 })
}

// lossyNotify drops the notifications of one partition: a NOTIFY lost
// while LISTEN reconnects, or a writer that does not notify.
type lossyNotify struct {
	*memstore.Store
	drop int
}

func (l *lossyNotify) SubscribePartitions(ctx context.Context, fn func([]int)) error {
	return l.Store.SubscribePartitions(ctx, func(ps []int) {
		if ps = slices.DeleteFunc(slices.Clone(ps), func(p int) bool { return p == l.drop }); len(ps) > 0 {
			fn(ps)
		}
	})
}

// Polling finds a write whose notification was lost, even while another
// partition of the same worker is notified more often than PollInterval
// (its fetches used to reset the poll timer, so the quiet partition was
// never fetched again).
func TestRelayPollFindsUnnotifiedWriteBesideBusyPartition(t *testing.T) {
	st := memstore.New(2, nil)
	b := &broker{}
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.PollInterval = 200 * time.Millisecond
	r := startRelay(t, &lossyNotify{Store: st, drop: 1}, b, cfg)
	waitFor(t, "both leases", 10*time.Second, func() bool { return r.Stats().Leases == 2 })
	busy, quiet := keyFor(0, 2), keyFor(1, 2)
	// One busy write first, published: both partitions are fetched and
	// caught up by then.
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: busy}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first write", 10*time.Second, func() bool { return len(b.delivered()) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { // traffic on partition 0 every 50 ms (load, not synchronisation)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = st.Write(ctx, outbox.Message{Topic: "t", Key: busy})
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()
	m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: quiet}
	if err := st.Write(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unnotified write (PollInterval 200ms)", 10*time.Second, func() bool {
		_, pending := st.Record(m.ID)
		return !pending
	})
}

// countingGate counts deliveries per ID and, while closed, holds every
// Publish call (a slow broker).
type countingGate struct {
	mu      sync.Mutex
	n       map[string]int
	open    chan struct{}
	entered atomic.Int32
}

func newCountingGate(closed bool) *countingGate {
	g := &countingGate{n: map[string]int{}, open: make(chan struct{})}
	if !closed {
		close(g.open)
	}
	return g
}

func (g *countingGate) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	g.entered.Add(1)
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range msgs {
		g.n[m.ID]++
	}
	return make([]error, len(msgs))
}

func (g *countingGate) Close() error { return nil }

func (g *countingGate) count(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n[id]
}

func (g *countingGate) total() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.n)
}

// A relay handing partitions back to a relay that joins keeps them until
// their publishes in flight are acknowledged and settled: released at
// once, the new owner published the same messages again, with no crash
// and no lost acknowledgement.
func TestRelayShedWaitsForPublishesInFlight(t *testing.T) {
	st := memstore.New(2, nil)
	ga, gb := newCountingGate(true), newCountingGate(false)
	var roundsA atomic.Int64
	cfg := outbox.Config{
		Node: "a", Workers: 1, BatchSize: 10, PublishTimeout: 5 * time.Second, LeaseTTL: 20 * time.Second,
		HeartbeatInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
		Hook: func(e outbox.Event) {
			if e.Kind == outbox.EventLeases {
				roundsA.Add(1)
			}
		},
	}
	a := startRelay(t, st, ga, cfg)
	waitFor(t, "a to hold both partitions", 10*time.Second, func() bool { return a.Stats().Leases == 2 })
	ids := []string{outbox.NewID(), outbox.NewID()}
	if err := st.Write(context.Background(),
		outbox.Message{ID: ids[0], Topic: "t", Key: keyFor(0, 2)},
		outbox.Message{ID: ids[1], Topic: "t", Key: keyFor(1, 2)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to publish", 10*time.Second, func() bool { return ga.entered.Load() > 0 })

	bcfg := cfg
	bcfg.Node, bcfg.Hook = "b", nil
	b := startRelay(t, st, gb, bcfg)
	waitFor(t, "b to heartbeat", 10*time.Second, b.Ready)
	// a sees b within a round and sheds a partition; give it a few.
	since := roundsA.Load()
	waitFor(t, "a's lease rounds", 10*time.Second, func() bool { return roundsA.Load() >= since+3 })
	if n := b.Stats().Leases; n != 0 || gb.total() != 0 {
		t.Errorf("while a's publish was in flight, b held %d partition(s) and published %d message(s); want none", n, gb.total())
	}
	ga.mu.Lock()
	close(ga.open) // a's broker acknowledges, well within PublishTimeout
	ga.mu.Unlock()
	waitFor(t, "the drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	waitFor(t, "b to take a's surplus partition", 10*time.Second, func() bool { return b.Stats().Leases == 1 && a.Stats().Leases == 1 })
	for _, id := range ids {
		if n := ga.count(id) + gb.count(id); n != 1 {
			t.Errorf("message %s published %d times (a %d, b %d), with no crash and no lost ack", id, n, ga.count(id), gb.count(id))
		}
	}
	if f := a.Stats().Fenced; f != 0 {
		t.Errorf("a was fenced %d times handing a partition back; want 0", f)
	}
}

// slowSettle is a store without marks or notifications (like DynamoDB:
// the relay sweeps below its cursors) whose Settle takes a while.
type slowSettle struct {
	outbox.Store
	d time.Duration
}

func (s slowSettle) Settle(ctx context.Context, node string, st []outbox.Settlement) error {
	time.Sleep(s.d) // a slow database, not synchronisation
	return s.Store.Settle(ctx, node, st)
}

// A record that failed once and was then delivered while its retry was
// still being written must not look settled when the retry's write
// finishes: the sweep would find it below the cursor and publish it again.
func TestRelaySweepAfterRetryDoesNotRepublish(t *testing.T) {
	st := memstore.New(1, nil)
	var mu sync.Mutex
	attempts := map[string]int{}
	b := &broker{fail: func(m *outbox.Message) string {
		mu.Lock()
		defer mu.Unlock()
		if attempts[m.ID]++; attempts[m.ID] == 1 {
			return "before" // not delivered
		}
		return ""
	}}
	cfg := fastConfig()
	cfg.Workers = 1
	r := startRelay(t, slowSettle{st, 50 * time.Millisecond}, b, cfg)
	const n = 20
	for i := range n {
		if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: fmt.Sprint("k", i)}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, m := range b.delivered() {
		seen[m.ID]++
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("message %s delivered %d times after one failure before the broker; want once", id, k)
		}
	}
	if len(seen) != n {
		t.Errorf("%d messages delivered, want %d", len(seen), n)
	}
}

// cutSlow is relay a's view of the store: heartbeats that can be cut (a
// stalled process) and slow settles.
type cutSlow struct {
	*memstore.Store
	cut  atomic.Bool
	slow time.Duration
}

func (c *cutSlow) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if c.cut.Load() {
		return 0, fmt.Errorf("cut")
	}
	return c.Store.Heartbeat(ctx, node, ttl)
}

func (c *cutSlow) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if c.cut.Load() {
		return nil, fmt.Errorf("cut")
	}
	return c.Store.AcquireLeases(ctx, node, held, want, ttl)
}

func (c *cutSlow) Settle(ctx context.Context, node string, st []outbox.Settlement) error {
	time.Sleep(c.slow) // a slow database, not synchronisation
	return c.Store.Settle(ctx, node, st)
}

// A record dead-lettered in memory holds its key until the dead-lettering
// is written. Released at once, the next record of the key went out; when
// the dead-lettering was then fenced, the next owner published the "dead"
// record (never dead-lettered) after it.
func TestRelayDeadLetterHoldsKeyUntilWritten(t *testing.T) {
	st := memstore.New(1, nil)
	var mu sync.Mutex
	tries := map[string]int{}
	m1 := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	m2 := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	b := &broker{fail: func(m *outbox.Message) string {
		mu.Lock()
		defer mu.Unlock()
		if tries[m.ID]++; m.ID == m1.ID && tries[m.ID] == 1 {
			return "before" // transient, but on the last attempt allowed
		}
		return ""
	}}
	tried := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return tries[id]
	}
	cs := &cutSlow{Store: st, slow: 1500 * time.Millisecond}
	cfg := outbox.Config{
		Node: "a", Workers: 1, BatchSize: 10, MaxAttempts: 1,
		LeaseTTL: 600 * time.Millisecond, PublishTimeout: 150 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}
	a := startRelay(t, cs, b, cfg)
	waitFor(t, "a's lease", 10*time.Second, func() bool { return a.Stats().Leases == 1 })
	if err := st.Write(context.Background(), m1, m2); err != nil {
		t.Fatal(err)
	}
	// a's only attempt at m1 fails: its dead-lettering is being written.
	waitFor(t, "a to dead-letter m1", 10*time.Second, func() bool { return a.Stats().DeadLettered == 1 })
	cs.cut.Store(true) // a stalls before that write lands
	bcfg := cfg
	bcfg.Node = "b"
	startRelay(t, st, b, bcfg)
	waitFor(t, "the drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	var order []string
	for _, m := range b.delivered() {
		switch m.ID {
		case m1.ID:
			order = append(order, "m1")
		case m2.ID:
			order = append(order, "m2")
		}
	}
	dead := len(st.Dead()) == 1
	if !dead && (len(order) == 0 || order[0] != "m1") {
		t.Errorf("broker saw %v (m1 tried %d times) and m1 was not dead-lettered: m2 of the same key went first", order, tried(m1.ID))
	}
	if dead && slices.Contains(order, "m1") {
		t.Errorf("m1 was dead-lettered and delivered: %v", order)
	}
}

// Stop on a relay never started returns, closes Done, and can be called
// again.
func TestRelayStopWithoutStart(t *testing.T) {
	r, err := outbox.NewRelay(memstore.New(1, nil), &broker{}, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("Done is not closed after Stop on a relay never started")
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
}

// HeartbeatInterval must leave room to publish: publishes start for
// LeaseTTL - 2 × PublishTimeout after each renewal.
func TestConfigHeartbeatWithinPublishWindow(t *testing.T) {
	c := outbox.Config{PublishTimeout: 100 * time.Millisecond, LeaseTTL: 210 * time.Millisecond}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if w := c.LeaseTTL - 2*c.PublishTimeout; c.HeartbeatInterval >= w {
		t.Errorf("default HeartbeatInterval %v, want below the publish window %v", c.HeartbeatInterval, w)
	}
	c.HeartbeatInterval = 70 * time.Millisecond
	if err := c.Validate(); err == nil {
		t.Error("HeartbeatInterval 70ms with a 10ms publish window: want an error")
	}
	d := outbox.Config{}.WithDefaults()
	if d.HeartbeatInterval != 5*time.Second {
		t.Errorf("default HeartbeatInterval %v, want 5s (LeaseTTL 30s, PublishTimeout 10s)", d.HeartbeatInterval)
	}
}
