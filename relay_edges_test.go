package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// Stop returns the error that ended the relay: a shutdown that had to
// abandon publishes in hand says so (it used to return nil always).
func TestRelayStopReportsAbandonedWork(t *testing.T) {
	st := memstore.New(1, nil)
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	b := &broker{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg := fastConfig()
	cfg.ShutdownTimeout = 50 * time.Millisecond
	r := startRelay(t, st, b, cfg)
	<-b.entered
	err := r.Stop()
	if !errors.Is(err, outbox.ErrShutdownTimeout) {
		t.Fatalf("Stop = %v, want ErrShutdownTimeout", err)
	}
	if !strings.Contains(err.Error(), "ShutdownTimeout") {
		t.Errorf("Stop error %q does not name Config.ShutdownTimeout", err)
	}
	if err2 := r.Stop(); !errors.Is(err2, outbox.ErrShutdownTimeout) {
		t.Errorf("second Stop = %v, want the same error", err2)
	}
	close(b.gate)
}

// A relay that stops cleanly returns nil, and one whose Leave fails says so.
func TestRelayStopReportsLeaveFailure(t *testing.T) {
	st := memstore.New(1, nil)
	r := startRelay(t, st, &broker{}, fastConfig())
	waitFor(t, "leases", 5*time.Second, func() bool { return r.Stats().Leases == 1 })
	st.FailNext("Leave", errors.New("store down"))
	err := r.Stop()
	if err == nil || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("Stop = %v, want the Leave failure", err)
	}
}

// failSettle makes every Settle fail while fail is set, counting calls.
type failSettle struct {
	*memstore.Store
	fail  atomic.Bool
	calls atomic.Int64
}

func (s *failSettle) Settle(ctx context.Context, node string, st []outbox.Settlement) error {
	s.calls.Add(1)
	if s.fail.Load() {
		return errors.New("store: settle refused (injected)")
	}
	return s.Store.Settle(ctx, node, st)
}

// countingBroker delivers everything and counts messages.
type countingBroker struct {
	broker
	msgs atomic.Int64
}

func (b *countingBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.msgs.Add(int64(len(msgs)))
	return b.broker.Publish(ctx, msgs)
}

// While every settle fails, a worker stops starting publishes once its
// unwritten settlements reach their bound; a crash then re-publishes at
// most that many. (It used to publish the whole backlog, piling up
// settlements without bound.) When settles work again, everything drains
// in key order.
func TestRelayStopsPublishingWhileSettlesFail(t *testing.T) {
	st := &failSettle{Store: memstore.New(4, nil)}
	st.fail.Store(true)
	written := writeKeys(t, st.Store, 2000, 500)
	b := &countingBroker{}
	cfg := fastConfig()
	cfg.Workers, cfg.BatchSize, cfg.InFlight = 1, 16, 2
	cfg.ShutdownTimeout = 2 * time.Second
	startRelay(t, st, b, cfg)
	waitFor(t, "settle retries", 20*time.Second, func() bool { return st.calls.Load() >= 8 })
	// Unwritten settlements are bounded by 2 × BatchSize × InFlight,
	// counting the publishes in flight. (On 443b377 the bound was checked
	// before a publish started, and publishes in flight added up to
	// BatchSize × InFlight more.)
	if n, bound := b.msgs.Load(), int64(2*cfg.BatchSize*cfg.InFlight); n > bound {
		t.Fatalf("published %d messages while every settle failed, want at most %d", n, bound)
	}
	st.fail.Store(false)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, b.delivered())
}

// gatedMarks holds the result of the first FetchMarked after arm until
// release: the fetch has read the store, but its result arrives late.
type gatedMarks struct {
	*memstore.Store
	armed    atomic.Bool
	held     chan struct{} // closed when a result is being held
	release  chan struct{}
	heldOnce sync.Once
}

func (g *gatedMarks) FetchMarked(ctx context.Context, cs []outbox.Cursor, limit int) ([]outbox.Record, string, error) {
	recs, mark, err := g.Store.FetchMarked(ctx, cs, limit)
	if g.armed.CompareAndSwap(true, false) {
		g.heldOnce.Do(func() { close(g.held) })
		<-g.release
	}
	return recs, mark, err
}

// publishLog counts deliveries per ID.
type publishLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (p *publishLog) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.n[m.ID]++
	}
	return make([]error, len(msgs))
}
func (p *publishLog) Close() error { return nil }
func (p *publishLog) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id]
}

// A sweep that finds a late record, publishes it and settles it while a
// marked fetch that also returns it is in flight must not publish it a
// second time when that fetch's result arrives. (It did, without any
// crash.)
func TestRelaySweepRacingMarkedFetchPublishesOnce(t *testing.T) {
	defer outbox.SetMarkedSweepInterval(20 * time.Millisecond)()
	st := &gatedMarks{Store: memstore.New(1, nil), held: make(chan struct{}), release: make(chan struct{})}
	pub := &publishLog{n: map[string]int{}}
	cfg := fastConfig()
	cfg.Workers = 1
	r := startRelay(t, st, pub, cfg)
	late := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "late"}
	commitLate, err := st.Begin(late)
	if err != nil {
		t.Fatal(err)
	}
	other := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "other"}
	if err := st.Write(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the later record published", 10*time.Second, func() bool { return pub.count(other.ID) == 1 })
	st.armed.Store(true)
	commitLate()
	<-st.held // a marked fetch has read the late record; its result waits
	waitFor(t, "the sweep publishes the late record", 10*time.Second, func() bool { return pub.count(late.ID) == 1 })
	waitFor(t, "the late record settled", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	calls := st.Calls("Fetch")
	close(st.release)
	waitFor(t, "fetches after the held one", 10*time.Second, func() bool { return st.Calls("Fetch") >= calls+3 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := pub.count(late.ID); n != 1 {
		t.Fatalf("late record published %d times without any failure, want 1", n)
	}
}

// slowBroker delivers after a fixed latency, recording the store's backlog
// when it first sees watch.
type slowBroker struct {
	st        *memstore.Store
	watch     string
	backlogAt atomic.Int64 // outstanding when watch was published; -1 before
}

func (b *slowBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	for _, m := range msgs {
		if m.ID == b.watch {
			b.backlogAt.CompareAndSwap(-1, int64(b.st.Outstanding()))
		}
	}
	t := time.NewTimer(2 * time.Millisecond) // a broker's round trip
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return outbox.FillErrors(len(msgs), ctx.Err())
	}
	return make([]error, len(msgs))
}
func (b *slowBroker) Close() error { return nil }

// With a store without marks (DynamoDB), a late record is found by the
// sweep within about SweepInterval whatever the load: it is published
// while a backlog is still draining. (The sweep used to run only when a
// worker had nothing to publish, so a late record waited for the end of
// the backlog while later records of its key could go first.)
func TestRelaySweepRunsUnderSteadyLoad(t *testing.T) {
	st := memstore.New(1, nil)
	late := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "late"}
	commitLate, err := st.Begin(late)
	if err != nil {
		t.Fatal(err)
	}
	const backlog = 6400
	writeKeys(t, st, backlog, backlog)
	b := &slowBroker{st: st, watch: late.ID}
	b.backlogAt.Store(-1)
	cfg := fastConfig()
	cfg.Workers, cfg.BatchSize, cfg.InFlight = 1, 16, 1
	startRelay(t, struct{ outbox.Store }{st}, b, cfg) // no marks: the sweep must find it
	waitFor(t, "publishing under way", 10*time.Second, func() bool { return st.Outstanding() < backlog })
	commitLate()
	waitFor(t, "late record published", 60*time.Second, func() bool { return b.backlogAt.Load() >= 0 })
	if n := b.backlogAt.Load(); n < backlog/4 {
		t.Fatalf("the late record was published with %d of %d records left: the sweep waited for the backlog", n, backlog)
	}
	waitFor(t, "drain", 60*time.Second, func() bool { return st.Outstanding() == 0 })
}

// A key whose head keeps failing with a retryable error holds back only
// its own key, however many of its records are queued behind the head:
// the other keys of its partition flow, and when it recovers its records
// follow in order. (refill used to skip a partition holding more than
// FetchSize/2 records, so a failing key with a backlog stalled its whole
// partition until the head was dead-lettered.)
func TestRelayFailingKeyHoldsOnlyItsKey(t *testing.T) {
	st := memstore.New(1, nil)
	written := map[string][]string{}
	write := func(key string, n int) {
		for range n {
			m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key}
			if err := st.Write(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			written[key] = append(written[key], m.ID)
		}
	}
	write("bad", 60)
	for i := range 40 {
		write(fmt.Sprintf("good%d", i), 3)
	}
	var healed atomic.Bool
	b := &broker{fail: func(m *outbox.Message) string {
		if m.Key == "bad" && !healed.Load() {
			return "before"
		}
		return ""
	}}
	cfg := fastConfig()
	cfg.Workers, cfg.BatchSize, cfg.FetchSize = 1, 4, 8
	cfg.MaxAttempts = 1000 // never dead-letter here
	startRelay(t, st, b, cfg)
	waitFor(t, "every other key delivered while bad fails", 20*time.Second, func() bool {
		return st.Outstanding() == len(written["bad"])
	})
	healed.Store(true)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, b.delivered())
	if d := st.Dead(); len(d) != 0 {
		t.Fatalf("%d dead letters", len(d))
	}
}

// topicBroker fails every message of a topic with the error fail returns
// (nil: deliver), recording deliveries in order.
type topicBroker struct {
	broker
	mu    sync.Mutex
	fail  map[string]error
	tries map[string]int // publishes per topic, failed or not
}

func (b *topicBroker) set(topic string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail == nil {
		b.fail = map[string]error{}
	}
	b.fail[topic] = err
}

func (b *topicBroker) triesOf(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tries[topic]
}

func (b *topicBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	var ok []*outbox.Message
	var okIdx []int
	b.mu.Lock()
	if b.tries == nil {
		b.tries = map[string]int{}
	}
	for i, m := range msgs {
		b.tries[m.Topic]++
		if err := b.fail[m.Topic]; err != nil {
			errs[i] = err
			continue
		}
		ok, okIdx = append(ok, m), append(okIdx, i)
	}
	b.mu.Unlock()
	for j, err := range b.broker.Publish(ctx, ok) {
		errs[okIdx[j]] = err
	}
	return errs
}

// writeTopics writes, per key, n messages alternating over topics, one
// transaction each, and returns the per-key order.
func writeTopics(t *testing.T, st *memstore.Store, keys, n int, topics ...string) map[string][]string {
	t.Helper()
	written := map[string][]string{}
	for i := range n {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			m := outbox.Message{ID: outbox.NewID(), Topic: topics[(i+k)%len(topics)], Key: key}
			if err := st.Write(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			written[key] = append(written[key], m.ID)
		}
	}
	return written
}

// A destination the broker refuses as a whole (a deleted stream, a missing
// topic, an unroutable exchange) is paused: no attempt is spent and nothing
// is dead-lettered, even with MaxAttempts 1; messages of other topics are
// published (under OrderScopeKey, those whose keys do not wait behind it);
// the relay reports it; and when the destination works again everything
// follows in order. (Each such message used to be dead-lettered on its
// first attempt.) Under the default OrderScopeTopic a key written to two
// topics, one of them blocked, goes on on the other: on 443b377 (one
// scope, the key) it froze ("orders.created sat at 3,751 outstanding").
func TestRelayBlockedDestinationPausesOnlyItself(t *testing.T) {
	for _, scope := range []outbox.OrderScope{outbox.OrderScopeTopic, outbox.OrderScopeKey} {
		t.Run(string(scope), func(t *testing.T) {
			st := memstore.New(4, nil)
			written := writeTopics(t, st, 20, 6, "gone", "fine")
			flow := map[string][]string{} // what must flow while "gone" is blocked
			for k := range 10 {
				key := fmt.Sprintf("solo%d", k)
				for range 3 {
					m := outbox.Message{ID: outbox.NewID(), Topic: "fine", Key: key}
					if err := st.Write(context.Background(), m); err != nil {
						t.Fatal(err)
					}
					written[key] = append(written[key], m.ID)
					flow[key] = append(flow[key], m.ID)
				}
			}
			if scope == outbox.OrderScopeTopic {
				for key, ids := range written {
					for _, id := range ids {
						if rec, _ := st.Record(id); rec.Topic == "fine" {
							flow[key] = append(flow[key], id)
						}
					}
				}
			}
			b := &topicBroker{}
			b.set("gone", outbox.Blocked("gone", errors.New("nats: no response from stream")))
			cfg := fastConfig()
			cfg.MaxAttempts = 1
			cfg.OrderScope = scope
			r := startRelay(t, st, b, cfg)
			waitFor(t, "the messages of the other topic delivered", 20*time.Second, func() bool {
				got := map[string]bool{}
				for _, m := range b.delivered() {
					got[m.ID] = true
				}
				for _, ids := range flow {
					for _, id := range ids {
						if !got[id] {
							return false
						}
					}
				}
				return true
			})
			waitFor(t, "the destination reported blocked", 10*time.Second, func() bool {
				bl := r.Blocked()
				return len(bl) == 1 && bl[0].Destination == "gone" && bl[0].Probes >= 2
			})
			if d := st.Dead(); len(d) != 0 {
				t.Fatalf("%d messages dead-lettered for a blocked destination", len(d))
			}
			for key, ids := range written {
				for _, id := range ids {
					if rec, ok := st.Record(id); ok && rec.Attempts != 0 {
						t.Fatalf("message %s of key %s has %d attempts: a blocked destination must spend none", id, key, rec.Attempts)
					}
				}
			}
			if s := r.Stats(); s.Blocked == 0 || s.BlockedDestinations != 1 || s.Failed != 0 {
				t.Errorf("Stats %+v: want Blocked > 0, BlockedDestinations 1, Failed 0", s)
			}
			b.set("gone", nil) // the operator recreated the stream
			waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
			checkScope(t, scope, written, b.delivered())
			waitFor(t, "unblocked", 10*time.Second, func() bool { return len(r.Blocked()) == 0 })
		})
	}
}

// A blocked destination with many more keys in one partition than a
// fetch holds keeps one of them in memory (its probe); the others leave
// memory and are read again once it works, so the partition is fetched on
// and its other destinations flow, under both scopes. (On 443b377 each
// paused key kept its head in memory and a partition holding 2 × FetchSize
// of them was no longer fetched: 150 keys passed, 300 stopped the
// partition for good.) Then everything is delivered in order.
func TestRelayManyBlockedKeysDoNotStopThePartition(t *testing.T) {
	for _, scope := range []outbox.OrderScope{outbox.OrderScopeTopic, outbox.OrderScopeKey} {
		t.Run(string(scope), func(t *testing.T) {
			st := memstore.New(1, nil)
			written := map[string][]string{}
			write := func(topic, key string) string {
				m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key}
				if err := st.Write(context.Background(), m); err != nil {
					t.Fatal(err)
				}
				written[key] = append(written[key], m.ID)
				return m.ID
			}
			for k := range 300 {
				write("gone", fmt.Sprint("g", k))
				write("gone", fmt.Sprint("g", k))
			}
			var flow []string
			for k := range 50 {
				flow = append(flow, write("fine", fmt.Sprint("f", k)))
			}
			b := &topicBroker{}
			b.set("gone", outbox.Blocked("gone", errors.New("nats: no response from stream")))
			cfg := fastConfig()
			cfg.Workers, cfg.BatchSize, cfg.FetchSize = 1, 16, 64
			cfg.OrderScope = scope
			startRelay(t, st, b, cfg)
			waitFor(t, "the other destination's messages delivered", 20*time.Second, func() bool {
				got := map[string]bool{}
				for _, m := range b.delivered() {
					got[m.ID] = true
				}
				for _, id := range flow {
					if !got[id] {
						return false
					}
				}
				return true
			})
			b.set("gone", nil)
			waitFor(t, "drain", 30*time.Second, func() bool { return st.Outstanding() == 0 })
			checkScope(t, scope, written, b.delivered())
		})
	}
}

// With OnPermanent = hold, a permanent failure holds its key instead of
// dead-lettering the message: the key's later messages wait, other keys
// flow, and nothing is dead-lettered.
func TestRelayPermanentHoldKey(t *testing.T) {
	st := memstore.New(2, nil)
	written := writeTopics(t, st, 6, 4, "poison", "fine")
	b := &topicBroker{}
	b.set("poison", outbox.Permanent(errors.New("message too large")))
	cfg := fastConfig()
	cfg.OnPermanent = outbox.PermanentHoldKey
	cfg.BackoffMax = 20 * time.Millisecond
	r := startRelay(t, st, b, cfg)
	waitFor(t, "held", 10*time.Second, func() bool { return r.Stats().Held >= 12 })
	if d := st.Dead(); len(d) != 0 {
		t.Fatalf("%d dead letters with OnPermanent hold", len(d))
	}
	b.set("poison", nil)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, b.delivered())
}

// A duplicate acknowledgement counts as delivered, and is counted.
func TestRelayDuplicateAckIsDelivered(t *testing.T) {
	st := memstore.New(1, nil)
	written := writeTopics(t, st, 3, 2, "dup")
	b := &topicBroker{}
	b.set("dup", fmt.Errorf("%w: sequence 7", outbox.ErrDuplicate))
	cfg := fastConfig()
	var logs countingHandler
	cfg.Logger = slog.New(&logs)
	r := startRelay(t, st, b, cfg)
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	if s := r.Stats(); s.Duplicates != 6 || s.Published != 6 || len(st.Dead()) != 0 {
		t.Fatalf("Stats %+v, %d dead: want 6 duplicates counted as published", s, len(st.Dead()))
	}
	// Rate-limited: one line per 10 s, not one per duplicate (a takeover
	// redelivers thousands).
	if n := logs.count("acknowledged a duplicate"); n < 1 || n >= 6 {
		t.Fatalf("%d duplicate WARN lines for 6 duplicates, want 1 (one per 10 s)", n)
	}
	_ = written
}

// countingHandler counts log records by message substring.
type countingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) count(sub string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// cutPublisher cannot reach its broker while down is set: every publish is
// refused as blocked and Health fails.
type cutPublisher struct {
	broker
	down atomic.Bool
}

func (p *cutPublisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	if p.down.Load() {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			errs[i] = outbox.Blocked(m.Topic, errors.New("nats: connection closed"))
		}
		return errs
	}
	return p.broker.Publish(ctx, msgs)
}

func (p *cutPublisher) Health(context.Context) error {
	if p.down.Load() {
		return errors.New("nats: not connected")
	}
	return nil
}

// A relay cut off from its broker for a lease TTL hands its partitions back
// and stops counting as live, so a relay that can publish takes them over
// and drains every key; when its broker comes back it takes its share
// again. (It used to keep its partitions for the whole outage, stalling
// their keys while the healthy relay could not take them.)
func TestRelayCutOffFromBrokerHandsLeasesBack(t *testing.T) {
	st := memstore.New(8, nil)
	cfg := fastConfig()
	cfg.LeaseTTL, cfg.HeartbeatInterval = 600*time.Millisecond, 50*time.Millisecond
	cfg.PublishTimeout = 100 * time.Millisecond
	pa := &cutPublisher{}
	pa.down.Store(true)
	cfgA := cfg
	cfgA.Node = "a"
	a := startRelay(t, st, pa, cfgA)
	waitFor(t, "a holds every partition", 10*time.Second, func() bool { return a.Stats().Leases == 8 })
	written := writeKeys(t, st, 400, 40)
	pb := &cutPublisher{}
	cfgB := cfg
	cfgB.Node = "b"
	b := startRelay(t, st, pb, cfgB)
	waitFor(t, "b drains every key while a is cut off", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, pb.delivered())
	if n := a.Stats().Leases; n != 0 {
		t.Errorf("the cut-off relay still holds %d leases", n)
	}
	pa.down.Store(false)
	waitFor(t, "a takes its share again", 20*time.Second, func() bool { return a.Stats().Leases > 0 && b.Stats().Leases < 8 })
}

// A relay that joins takes its fair share as soon as the relay holding
// every partition hands the surplus back, not at its own next heartbeat:
// here its heartbeat is an hour away. (Handed-back partitions used to sit
// unowned until the joining relay's next round, about 5 s by default.)
func TestRelayJoiningTakesHandedBackPartitionsAtOnce(t *testing.T) {
	st := memstore.New(16, nil)
	cfgA := fastConfig()
	cfgA.Node = "a"
	cfgA.LeaseTTL, cfgA.HeartbeatInterval, cfgA.PublishTimeout = 600*time.Millisecond, 50*time.Millisecond, 100*time.Millisecond
	a := startRelay(t, st, &broker{}, cfgA)
	waitFor(t, "a holds every partition", 10*time.Second, func() bool { return a.Stats().Leases == 16 })
	cfgB := fastConfig()
	cfgB.Node = "b"
	cfgB.LeaseTTL, cfgB.HeartbeatInterval = 3*time.Hour, time.Hour
	b := startRelay(t, st, &broker{}, cfgB)
	waitFor(t, "b takes its share between its heartbeats", 20*time.Second, func() bool {
		return b.Stats().Leases == 8 && a.Stats().Leases == 8
	})
}

// sweepCounter records the most cursors a sweep's Fetch (limit 1) asked for.
type sweepCounter struct {
	outbox.Store
	most atomic.Int64
}

func (s *sweepCounter) Fetch(ctx context.Context, cs []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if limit == 1 && int64(len(cs)) > s.most.Load() {
		s.most.Store(int64(len(cs)))
	}
	return s.Store.Fetch(ctx, cs, limit)
}

// A big transaction that commits late below the cursors of a store without
// marks is read by the sweep a fetch's worth at a time, not all at once:
// memory stays bounded by FetchSize. Everything is still published.
func TestRelaySweepReadsBigLateCommitInBoundedSteps(t *testing.T) {
	st := memstore.New(1, nil)
	var late []outbox.Message
	for i := range 200 {
		late = append(late, outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprintf("late%d", i)})
	}
	commitLate, err := st.Begin(late...)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "later"}); err != nil {
		t.Fatal(err)
	}
	sc := &sweepCounter{Store: struct{ outbox.Store }{st}} // no marks: the sweep must find them
	cfg := fastConfig()
	cfg.Workers, cfg.BatchSize, cfg.FetchSize = 1, 4, 8
	b := &broker{}
	startRelay(t, sc, b, cfg)
	waitFor(t, "the later record published", 10*time.Second, func() bool { return len(b.delivered()) == 1 })
	commitLate()
	waitFor(t, "the late transaction published", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	if most := sc.most.Load(); most > int64(cfg.FetchSize/2) {
		t.Fatalf("a sweep fetched %d late records at once, want at most FetchSize/2 = %d", most, cfg.FetchSize/2)
	}
}

// Relays started together (a deployment) share the partitions at once:
// the first takes every partition, and hands the second its share in one
// of its first rounds, not a heartbeat later (an hour here).
func TestRelaysStartedTogetherShareAtOnce(t *testing.T) {
	st := memstore.New(16, nil)
	start := func(node string) *outbox.Relay {
		cfg := fastConfig()
		cfg.Node = node
		cfg.LeaseTTL, cfg.HeartbeatInterval = 3*time.Hour, time.Hour
		return startRelay(t, st, &broker{}, cfg)
	}
	a := start("a")
	waitFor(t, "a holds every partition", 10*time.Second, func() bool { return a.Stats().Leases == 16 })
	b := start("b")
	waitFor(t, "a and b hold 8 partitions each, long before a heartbeat", 20*time.Second, func() bool {
		return a.Stats().Leases == 8 && b.Stats().Leases == 8
	})
}

// claimCounter counts ClaimUnordered calls and those that found nothing.
type claimCounter struct {
	*memstore.Store
	claims, empty atomic.Int64
}

func (c *claimCounter) ClaimUnordered(ctx context.Context, limit int, skip []string) (outbox.Claim, error) {
	cl, err := c.Store.ClaimUnordered(ctx, limit, skip)
	c.claims.Add(1)
	if err == nil && len(cl.Records()) == 0 {
		c.empty.Add(1)
	}
	return cl, err
}

// With ordering none, a notification wakes one worker, not all of them:
// a small transaction costs one claim (and a backlog still reaches every
// worker, see TestOrderingNone).
func TestOrderingNoneNotificationWakesOneWorker(t *testing.T) {
	st := &claimCounter{Store: memstore.New(4, nil)}
	cfg := fastConfig()
	cfg.Ordering = outbox.OrderingNone
	cfg.Workers = 4
	cfg.PollInterval = time.Hour // no poll: only notifications wake
	b := &broker{}
	startRelay(t, st, b, cfg)
	waitFor(t, "every worker's first claim found nothing", 10*time.Second, func() bool { return st.empty.Load() >= 4 })
	const n = 40
	before := st.claims.Load()
	for i := range n {
		if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		// (A write before the relay subscribed is announced too: the
		// subscription looks at every partition once it is live.)
		waitFor(t, "delivered", 10*time.Second, func() bool { return len(b.delivered()) == i+1 && st.Outstanding() == 0 })
	}
	// One claim finds each message; a worker whose wake-up raced with its
	// going idle may claim once more and find nothing. Waking every
	// worker made 4 claims per message.
	if claims := st.claims.Load() - before; claims > 2*n {
		t.Fatalf("%d messages took %d claims, want at most %d", n, claims, 2*n)
	}
}

// anyPartition is a PartitionNotifier that cannot name partitions: it
// passes nil, "any partition", for every write.
type anyPartition struct{ pn outbox.PartitionNotifier }

func (a anyPartition) SubscribePartitions(ctx context.Context, fn func([]int)) error {
	return a.pn.SubscribePartitions(ctx, func([]int) { fn(nil) })
}

// plainSubscriber has the plain Subscribe of the Notifier interface that
// earlier versions used, and no SubscribePartitions.
type plainSubscriber struct{ outbox.Store }

func (plainSubscriber) Subscribe(context.Context) (<-chan struct{}, error) {
	return make(chan struct{}), nil
}

// A store with only the old plain Subscribe is told, once, that the relay
// will only poll and what to implement instead.
func TestRelayWarnsOfPlainSubscribe(t *testing.T) {
	cfg := fastConfig()
	var logs countingHandler
	cfg.Logger = slog.New(&logs)
	if _, err := outbox.NewRelay(plainSubscriber{memstore.New(4, nil)}, &broker{}, cfg); err != nil {
		t.Fatal(err)
	}
	if n := logs.count("implement outbox.PartitionNotifier"); n != 1 {
		t.Fatalf("%d warnings naming PartitionNotifier, want 1", n)
	}
	logs = countingHandler{}
	if _, err := outbox.NewRelay(memstore.New(4, nil), &broker{}, cfg); err != nil {
		t.Fatal(err)
	}
	if n := logs.count("PartitionNotifier"); n != 0 {
		t.Fatalf("%d warnings for a store with SubscribePartitions, want none", n)
	}
}

// A store whose notifications name no partition (every one nil) still
// wakes the relay: nil is "any partition".
func TestRelayWithAnyPartitionNotifications(t *testing.T) {
	ms := memstore.New(4, nil)
	st := struct {
		outbox.Store
		outbox.PartitionNotifier
	}{ms, anyPartition{ms}}
	cfg := fastConfig()
	cfg.PollInterval = time.Hour // only notifications can wake it
	b := &broker{}
	startRelay(t, st, b, cfg)
	for i := range 5 {
		if err := ms.Write(context.Background(), outbox.Message{Topic: "t", Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "delivered", 10*time.Second, func() bool { return len(b.delivered()) == i+1 })
	}
}
