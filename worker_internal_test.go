package outbox

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// A retry that has come due makes an idle worker wake at once, unless
// build could not take it: its partition is being handed back, its lease
// is about to run out, or every publish slot is busy. The worker used to
// wake every millisecond until then.
func TestNextWakeIgnoresRetriesBuildCannotTake(t *testing.T) {
	cfg := Config{PollInterval: time.Second, SweepInterval: time.Hour}.WithDefaults()
	r := &Relay{cfg: cfg, store: storeStub{}, queueKey: queueKeyOf(OrderScopeKey)}
	now := time.Now()
	newPart := func(shed bool, validUntil time.Time) *lane {
		ps := newLane(Lease{}, queueKeyOf(OrderScopeKey))
		ps.shed, ps.validUntil = shed, validUntil
		// A key whose head waits for a retry time, which has come.
		rec := &Record{Message: Message{ID: NewID(), Key: "k"}, NextAttemptAt: now.Add(time.Minute)}
		ps.q.push(rec, now)
		rec.NextAttemptAt = now.Add(-time.Second)
		return ps
	}
	valid := now.Add(time.Hour)
	for _, c := range []struct {
		name     string
		ps       *lane
		inflight int
		soon     bool // want a wake-up at once
	}{
		{"due retry", newPart(false, valid), 0, true},
		{"partition handed back", newPart(true, valid), 0, false},
		{"lease running out", newPart(false, now.Add(cfg.PublishTimeout/2)), 0, false},
		{"every slot busy", newPart(false, valid), cfg.InFlight, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorker(r, 0, nil)
			w.pipe.lanes[0], w.pipe.inflight = c.ps, c.inflight
			w.capture.lastPoll, w.capture.lastSweep = now, now
			got := w.nextWake(now)
			if c.soon && got > time.Millisecond {
				t.Errorf("nextWake = %v, want 1ms (a retry is due)", got)
			}
			if !c.soon && got < cfg.PollInterval/2 {
				t.Errorf("nextWake = %v, want about PollInterval (%v): build cannot take the due retry", got, cfg.PollInterval)
			}
		})
	}
}

// storeStub is a Store with no optional abilities; nextWake only looks at
// which interfaces it implements.
type storeStub struct{ Store }

// An overdue poll wakes an idle worker at once, but not one whose fetch is
// in flight or whose publish slots are all busy: refill cannot poll then,
// and the fetch or a result wakes it anyway. (It used to wake every
// millisecond, costing relay/key about 15% of its throughput.)
func TestNextWakeOverduePoll(t *testing.T) {
	cfg := Config{PollInterval: time.Second, SweepInterval: time.Hour}.WithDefaults()
	r := &Relay{cfg: cfg, store: storeStub{}, queueKey: queueKeyOf(OrderScopeKey)}
	now := time.Now()
	for _, c := range []struct {
		name     string
		fetching bool
		inflight int
		soon     bool
	}{
		{"idle", false, 0, true},
		{"fetch in flight", true, 0, false},
		{"every slot busy", false, cfg.InFlight, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorker(r, 0, nil)
			w.capture.fetching, w.pipe.inflight, w.capture.lastSweep = c.fetching, c.inflight, now
			got := w.nextWake(now) // lastPoll is zero: long overdue
			if c.soon && got > time.Millisecond {
				t.Errorf("nextWake = %v, want 1ms (a poll is overdue)", got)
			}
			if !c.soon && got < cfg.PollInterval/2 {
				t.Errorf("nextWake = %v, want about PollInterval (%v): refill cannot poll now", got, cfg.PollInterval)
			}
		})
	}
}

// While the store backs off, the worker starts nothing (no poll, sweep or
// publish): an overdue poll or a due retry must not wake it before the
// backoff ends; settlements coming due still do. (It used to wake every
// millisecond for the whole backoff.)
func TestNextWakeDuringStoreBackoff(t *testing.T) {
	cfg := Config{PollInterval: time.Second, SweepInterval: time.Hour}.WithDefaults()
	r := &Relay{cfg: cfg, store: storeStub{}, queueKey: queueKeyOf(OrderScopeKey)}
	now := time.Now()
	w := newWorker(r, 0, nil)
	ln := newLane(Lease{}, queueKeyOf(OrderScopeKey))
	ln.validUntil = now.Add(time.Hour)
	rec := &Record{Message: Message{ID: NewID(), Key: "k"}, NextAttemptAt: now.Add(time.Minute)}
	ln.q.push(rec, now)
	rec.NextAttemptAt = now.Add(-time.Second) // a retry due now
	w.pipe.lanes[0] = ln
	w.retryStore = now.Add(2 * time.Second) // lastPoll is zero: a poll is overdue too
	if got := w.nextWake(now); got != 2*time.Second {
		t.Errorf("nextWake = %v during a 2s store backoff, want 2s", got)
	}
	w.pipe.settle[0] = &Settlement{Delivered: []string{"x"}}
	w.pipe.settleN, w.pipe.settleSince = 1, now
	if got, due := w.nextWake(now), w.pipe.settleAt().Sub(now); got != max(due, time.Millisecond) {
		t.Errorf("nextWake = %v with settlements due in %v during the backoff, want %v", got, due, due)
	}
}

// countPub counts Publish calls.
type countPub struct{ calls int }

func (p *countPub) Publish(ctx context.Context, msgs []*Message) []error {
	p.calls++
	return make([]error, len(msgs))
}
func (p *countPub) Close() error { return nil }

// A publish goroutine that starts after its deadline (fixed when the batch
// was built) or after the relay was killed does not publish: the lease it
// was built under may be gone. The record goes back to the head of its key
// with no attempt counted. (The deadline used to start when the goroutine
// did, and a killed relay still called Publish.)
func TestLaunchDoesNotPublishPastItsDeadline(t *testing.T) {
	cfg := Config{}.WithDefaults()
	for _, c := range []struct {
		name     string
		killed   bool
		deadline time.Duration
	}{
		{"deadline passed", false, -time.Millisecond},
		{"relay killed", true, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			pub := &countPub{}
			r := &Relay{cfg: cfg, store: storeStub{}, pub: pub, queueKey: queueKeyOf(OrderScopeKey)}
			r.dests = newDestinations(slog.New(slog.DiscardHandler), func(Event) {}, cfg.PublishTimeout)
			w := newWorker(r, 0, nil)
			ps := newLane(Lease{Partition: 0, Epoch: 1}, queueKeyOf(OrderScopeKey))
			w.pipe.lanes[0] = ps
			rec := &Record{Message: Message{ID: NewID(), Key: "k"}}
			ps.inflight[rec.ID] = rec
			ctx, cancel := context.WithCancel(context.Background())
			if c.killed {
				cancel()
			}
			defer cancel()
			w.pipe.launch(ctx, []*Record{rec}, time.Now().Add(c.deadline))
			(<-w.events).apply(ctx, w)
			if pub.calls != 0 {
				t.Fatalf("Publish called %d times after the deadline or kill", pub.calls)
			}
			if rec.Attempts != 0 || w.pipe.settleN != 0 {
				t.Errorf("attempts %d, settlements %d: a publish never started must cost nothing", rec.Attempts, w.pipe.settleN)
			}
			if got := ps.q.take(10, 1, time.Now()); len(got) != 1 || got[0] != rec {
				t.Errorf("record not back at the head of its key: %v", got)
			}
		})
	}
}
