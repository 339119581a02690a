package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// Ordering none goes through the pipeline in claims mode; these tests try
// the paths where a claim could lose or stall a message.

// checkNoneLost fails t if a written message is missing from got (order
// and duplicates aside: ordering none keeps no order).
func checkNoneLost(t *testing.T, written map[string][]string, got []outbox.Message) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range got {
		seen[m.ID] = true
	}
	for _, ids := range written {
		for _, id := range ids {
			if !seen[id] {
				t.Fatalf("%s lost", id)
			}
		}
	}
}

func unorderedConfig() outbox.Config {
	cfg := fastConfig()
	cfg.Ordering = outbox.OrderingNone
	return cfg
}

// A claim whose settle fails is rolled back: its records are claimed and
// published again, none is lost, and each is counted once.
func TestOrderingNoneSettleFailureRepublishes(t *testing.T) {
	st := memstore.New(4, nil)
	written := writeKeys(t, st, 300, 10)
	st.FailNext("ClaimSettle", errors.New("connection reset"))
	b := &broker{}
	r := startRelay(t, st, b, unorderedConfig())
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	got := b.delivered()
	checkNoneLost(t, written, got)
	// Counted once the claim committed: the rolled-back claim's messages
	// count once, when published again.
	if n := r.Stats().Published; n != 300 {
		t.Errorf("Stats().Published = %d, want 300 (a claim is counted when its settle commits)", n)
	}
	seen := map[string]bool{}
	for _, m := range got {
		seen[m.ID] = true
	}
	if len(got) == len(seen) {
		t.Fatalf("no message was published twice: the failed settle was not exercised (ClaimSettle calls: %d)", st.Calls("ClaimSettle"))
	}
}

// blockingPub refuses topic "down" as a whole (a blocked destination) until
// opened, fails the IDs in perm permanently, and delivers the rest.
type blockingPub struct {
	mu        sync.Mutex
	open      bool
	perm      map[string]bool
	got       map[string]int
	downCalls int
}

func (p *blockingPub) Publish(_ context.Context, msgs []*outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	down := false
	for i, m := range msgs {
		switch {
		case m.Topic == "down" && !p.open:
			errs[i] = outbox.Blocked("down", errors.New("no stream for subject down"))
			down = true
		case p.perm[m.ID]:
			errs[i] = outbox.Permanent(errors.New("message too large"))
		default:
			p.got[m.ID]++
		}
	}
	if down {
		p.downCalls++
	}
	return errs
}
func (p *blockingPub) Close() error { return nil }

func (p *blockingPub) state() (downCalls int, got map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := make(map[string]int, len(p.got))
	for k, v := range p.got {
		c[k] = v
	}
	return p.downCalls, c
}

// In ordering none a blocked destination spends no attempts (its messages
// wait in the store, however many claims find them) and a permanent
// failure is dead-lettered after one attempt, while the other messages
// flow; when the destination works again, its messages are delivered.
func TestOrderingNoneBlockedAndPermanent(t *testing.T) {
	st := memstore.New(4, nil)
	pub := &blockingPub{perm: map[string]bool{}, got: map[string]int{}}
	var ok, down []string
	var msgs []outbox.Message
	for i := range 150 {
		m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: fmt.Sprint("k", i%7), Payload: []byte("x")}
		switch {
		case i%10 == 0:
			pub.perm[m.ID] = true
		case i%3 == 0:
			m.Topic = "down"
			down = append(down, m.ID)
		default:
			ok = append(ok, m.ID)
		}
		msgs = append(msgs, m)
	}
	if err := st.Write(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	cfg := unorderedConfig()
	cfg.MaxAttempts = 2
	r := startRelay(t, st, pub, cfg)
	// More claims found the blocked messages than MaxAttempts allows
	// attempts: had they spent attempts, they would be dead now.
	waitFor(t, "the other messages delivered and the blocked ones claimed 4 times", 20*time.Second, func() bool {
		calls, got := pub.state()
		return calls >= 4 && len(got) == len(ok) && len(st.Dead()) == len(pub.perm)
	})
	if len(r.Blocked()) != 1 || r.Blocked()[0].Destination != "down" {
		t.Errorf("Blocked() = %+v, want the destination down", r.Blocked())
	}
	for _, dl := range st.Dead() {
		if !pub.perm[dl.ID] || dl.Attempts != 1 {
			t.Errorf("dead letter %s (attempts %d): want only the permanent failures, after one attempt", dl.ID, dl.Attempts)
		}
	}
	for _, id := range down {
		rec, found := st.Record(id)
		if !found || rec.Attempts != 0 {
			t.Fatalf("blocked message %s: in the outbox %v, attempts %d; want it waiting with no attempt spent", id, found, rec.Attempts)
		}
	}
	pub.mu.Lock()
	pub.open = true
	pub.mu.Unlock()
	waitFor(t, "the blocked messages delivered", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	_, got := pub.state()
	for _, id := range append(ok, down...) {
		if got[id] == 0 {
			t.Fatalf("%s lost", id)
		}
	}
}

// A relay of ordering none killed while a claim's publish hangs (Stop
// after ShutdownTimeout) abandons the claim: its rows are released, not
// settled (the kill is not the messages' failure: with MaxAttempts 1 none
// is dead-lettered), and the next relay publishes every message. (The old
// loop settled the kill's errors with a store that ignores the dead
// context, such as this one: 64 dead letters.)
func TestOrderingNoneKilledMidPublish(t *testing.T) {
	st := memstore.New(4, nil)
	written := writeKeys(t, st, 100, 10)
	b := &broker{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg := unorderedConfig()
	cfg.ShutdownTimeout = 50 * time.Millisecond
	cfg.MaxAttempts = 1
	r := startRelay(t, st, b, cfg)
	<-b.entered
	if err := r.Stop(); !errors.Is(err, outbox.ErrShutdownTimeout) {
		t.Fatalf("Stop = %v, want ErrShutdownTimeout", err)
	}
	close(b.gate)
	if n := st.Outstanding(); n != 100 {
		t.Fatalf("%d messages left in the outbox after the kill, want all 100 (none was acknowledged)", n)
	}
	if n, dead := len(st.Dead()), r.Stats().DeadLettered; n != 0 || dead != 0 {
		t.Fatalf("%d dead letters (Stats %d) after the kill, want none: the claim is abandoned, not settled", n, dead)
	}
	b2 := &broker{}
	startRelay(t, st, b2, unorderedConfig())
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	checkNoneLost(t, written, b2.delivered())
}

// In ordering none, a blocked destination with more waiting messages than
// every worker's claims hold does not starve the others: claims skip it
// (one probe at a time goes to it), a message of another destination
// written after its backlog is published, the blocked messages spend no
// attempt, and they all go once it works. (On 443b377 the claims took the
// oldest rows whatever their destination: 1,664 refused sends in 5 s and
// the working destination's message never published.)
func TestOrderingNoneBlockedBacklogDoesNotStarveOthers(t *testing.T) {
	st := memstore.New(4, nil)
	pub := &blockingPub{perm: map[string]bool{}, got: map[string]int{}}
	cfg := unorderedConfig()
	cfg.Workers, cfg.BatchSize = 2, 16
	cfg.MaxAttempts = 1
	var down []outbox.Message
	for i := range 10 * cfg.Workers * cfg.BatchSize {
		down = append(down, outbox.Message{ID: outbox.NewID(), Topic: "down", Key: fmt.Sprint("k", i%7), Payload: []byte("x")})
	}
	if err := st.Write(context.Background(), down...); err != nil {
		t.Fatal(err)
	}
	fine := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "k1", Payload: []byte("x")}
	if err := st.Write(context.Background(), fine); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, st, pub, cfg)
	waitFor(t, "the other destination's message published", 20*time.Second, func() bool {
		_, got := pub.state()
		return got[fine.ID] > 0
	})
	waitFor(t, "the destination reported blocked", 10*time.Second, func() bool {
		bl := r.Blocked()
		return len(bl) == 1 && bl[0].Destination == "down" && bl[0].Probes >= 2
	})
	// A few more probes, then: one message per probe, not a claim's worth.
	waitFor(t, "probes", 10*time.Second, func() bool { return r.Blocked()[0].Probes >= 4 })
	if bl := r.Blocked(); len(bl) == 1 && r.Stats().Blocked > int64(bl[0].Probes)+int64(cfg.Workers*cfg.BatchSize) {
		t.Errorf("%d refused sends for %d probes: a paused destination's records must not be claimed and sent again and again", r.Stats().Blocked, bl[0].Probes)
	}
	for _, m := range down {
		if rec, ok := st.Record(m.ID); !ok || rec.Attempts != 0 {
			t.Fatalf("blocked message %s: in the outbox %v, attempts %d; want it waiting with no attempt spent", m.ID, ok, rec.Attempts)
		}
	}
	pub.mu.Lock()
	pub.open = true
	pub.mu.Unlock()
	waitFor(t, "the blocked messages delivered", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	if n := len(st.Dead()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}
