package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// seamSource is a capture side that is not the poller: it records what the
// pipeline hands back through the seam (source). writeSettlements runs on
// the pipeline's settler goroutine, the others on the test's (the loop's).
type seamSource struct {
	mu      sync.Mutex
	written []Settlement
	goneIDs []string
	left    map[string][]string // key → IDs that left memory
	recov   []string            // keys that recovered
}

func (s *seamSource) writeSettlements(_ context.Context, batch []Settlement, _ time.Duration) ([]Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = append(s.written, batch...)
	return nil, false
}

func (s *seamSource) gone(id string) { s.goneIDs = append(s.goneIDs, id) }

func (s *seamSource) dropped(_ int, k string, recs []*Record) {
	for _, r := range recs {
		s.left[k] = append(s.left[k], r.ID)
	}
}

func (s *seamSource) recovered(_ int, k string) { s.recov = append(s.recov, k) }

// orderPub fails the first attempt of the IDs in failOnce (retryable) and
// records every message it was given, in order.
type orderPub struct {
	mu       sync.Mutex
	failOnce map[string]bool
	got      []string
}

func (p *orderPub) Publish(_ context.Context, msgs []*Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		p.got = append(p.got, m.ID)
		if p.failOnce[m.ID] {
			delete(p.failOnce, m.ID)
			errs[i] = errors.New("broker hiccup")
		}
	}
	return errs
}
func (p *orderPub) Close() error { return nil }

// The pipeline can be driven by a capture side other than the poller,
// through the seam alone: it keeps a key's order across a retry, tells the
// capture which records of the failing key left memory and when the key
// recovered (so that it reads them again), hands its settlements back to
// the capture to write, and says which deliveries and dead letters were
// written.
func TestPipelineSeam(t *testing.T) {
	cfg := Config{RetryPolicy: func(int) time.Duration { return 0 }}.WithDefaults()
	pub := &orderPub{failOnce: map[string]bool{"a1": true}}
	r := &Relay{cfg: cfg, store: storeStub{}, pub: pub, log: slog.New(slog.DiscardHandler), queueKey: queueKeyOf(OrderScopeKey)}
	r.dests = newDestinations(r.log, func(Event) {}, cfg.PublishTimeout)
	r.caps.keyPipeline = 1
	src := &seamSource{left: map[string][]string{}}
	events := make(chan workerEvent, cfg.InFlight+3)
	p := newPipeline(r, src, events)
	ctx := context.Background()
	defer p.startSettler(ctx)()
	apply := func() {
		switch ev := (<-events).(type) {
		case publishResult:
			p.handle(ev)
		case settleResult:
			p.settled(ev)
		default:
			t.Fatalf("unexpected event %T", ev)
		}
	}
	// round builds, publishes what it built, applies the results and
	// writes the settlements at once; it returns the IDs built.
	round := func() []string {
		var ids []string
		batches := p.build(cfg.Now())
		for _, b := range batches {
			for _, r := range b {
				ids = append(ids, r.ID)
			}
			p.launch(ctx, b, time.Now().Add(time.Minute))
		}
		for range batches {
			apply()
		}
		p.stopping = true // settle at once, not at the next SettleInterval
		if p.settleN > 0 {
			p.startSettle()
			apply()
		}
		slices.Sort(ids)
		return ids
	}

	lease := Lease{Partition: 0, Epoch: 1}
	p.open(heldLease{Lease: lease, validUntil: time.Now().Add(time.Hour)})
	p.reorder()
	rec := func(id, key string, seq int64) *Record {
		return &Record{Message: Message{ID: id, Key: key, Topic: "t"}, Seq: seq}
	}
	a2 := rec("a2", "a", 2)
	for _, r := range []*Record{rec("a1", "a", 1), a2, rec("b1", "b", 3)} {
		p.feed(r, cfg.Now())
	}

	// a1 and b1 go; a2 waits behind a1, which fails: a2 leaves memory.
	if got := round(); !slices.Equal(got, []string{"a1", "b1"}) {
		t.Fatalf("first round built %v, want the heads a1 and b1", got)
	}
	if got := src.left["a"]; !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("dropped %v of the failing key, want [a2]", got)
	}
	if !p.failing(0, "a") || p.known(a2) {
		t.Fatalf("key a failing %v, a2 still known %v: want failing, a2 gone from memory", p.failing(0, "a"), p.known(a2))
	}
	if !slices.Equal(src.recov, []string{"b"}) || !slices.Equal(src.goneIDs, []string{"b1"}) {
		t.Fatalf("recovered %v, gone %v; want [b] and [b1]", src.recov, src.goneIDs)
	}
	src.mu.Lock()
	written := slices.Clone(src.written)
	src.mu.Unlock()
	if len(written) != 1 || written[0].Lease != lease || !slices.Equal(written[0].Delivered, []string{"b1"}) ||
		len(written[0].Retry) != 1 || written[0].Retry[0].ID != "a1" || written[0].Retry[0].Attempts != 1 {
		t.Fatalf("settlements written through the capture side: %+v; want b1 delivered and a1's retry, under lease %v", written, lease)
	}

	// a1's retry is due (RetryPolicy 0): it goes alone, is delivered, and
	// key a recovers; the capture reads a2 again and feeds it.
	if got := round(); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("second round built %v, want the retry of a1 alone", got)
	}
	if !slices.Equal(src.recov, []string{"b", "a"}) || p.failing(0, "a") {
		t.Fatalf("recovered %v (failing %v); want key a recovered", src.recov, p.failing(0, "a"))
	}
	p.feed(a2, cfg.Now())
	if got := round(); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("third round built %v, want a2", got)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if want := []string{"a1", "a1", "a2"}; !slices.Equal(slices.DeleteFunc(slices.Clone(pub.got), func(id string) bool { return id == "b1" }), want) {
		t.Fatalf("key a reached the broker as %v, want %v", pub.got, want)
	}
	if p.busy() || len(p.lanes[0].settling) != 0 || len(p.lanes[0].inflight) != 0 {
		t.Fatalf("pipeline busy after every settlement was written")
	}
}

// nopClaim is a claim whose settle does nothing.
type nopClaim struct{ recs []Record }

func (c nopClaim) Records() []Record                      { return c.recs }
func (nopClaim) Settle(context.Context, Settlement) error { return nil }
func (nopClaim) Release(context.Context) error            { return nil }

// nopPub acknowledges everything.
type nopPub struct{}

func (nopPub) Publish(_ context.Context, msgs []*Message) []error { return make([]error, len(msgs)) }
func (nopPub) Close() error                                       { return nil }

// BenchmarkClaimsPublishAll is the relay's own cost per record of a claim
// of 500 records over 64 partitions in claims mode (no store, no broker).
func BenchmarkClaimsPublishAll(b *testing.B) {
	cfg := Config{BatchSize: 500}.WithDefaults()
	r := &Relay{cfg: cfg, store: storeStub{}, pub: nopPub{}, log: slog.New(slog.DiscardHandler), queueKey: queueKeyOf(OrderScopeKey)}
	r.dests = newDestinations(r.log, func(Event) {}, cfg.PublishTimeout)
	src := &claimSource{r: r}
	p := newClaimsPipeline(r, src)
	ctx := context.Background()
	recs := make([]Record, cfg.BatchSize)
	for i := range recs {
		recs[i] = Record{Message: Message{ID: NewID(), Key: fmt.Sprint("k", i%1000), Topic: "t"}, Partition: i % 64, Seq: int64(i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		claim := nopClaim{recs: slices.Clone(recs)}
		src.begin(claim, len(claim.recs))
		now := cfg.Now()
		for j := range claim.recs {
			p.feed(&claim.recs[j], now)
		}
		if !p.publishAll(ctx) {
			b.Fatal("publishAll abandoned the claim")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}
