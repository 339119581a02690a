package outbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The coordinator decides which partitions the relay owns, from one
// goroutine that alone holds that state: with a Store, it heartbeats,
// renews, balances and hands back the relay's partition leases, one round
// every HeartbeatInterval; with a StreamStore it holds the stream or stands
// by (stream.go). Workers get a snapshot of their partitions after every
// change and report back on Relay.reports.
type coordinator struct {
	r      *Relay
	leases map[int]*heldLease // the partitions the relay owns now
	round  roundResult        // of the last lease round
	// streamAsked: with a StreamStore, Hold was called since the last
	// Release (the store is trying to take, or holds, the stream for this
	// relay).
	streamAsked bool
}

func newCoordinator(r *Relay) *coordinator {
	return &coordinator{r: r, leases: map[int]*heldLease{}}
}

// run coordinates until ctx ends, one round every HeartbeatInterval (or
// sooner: after a failure, while cut off, while eager to take partitions,
// or when the stream's Hold says its answer changed), applying the
// workers' reports between rounds. workCtx ending means shutdown has
// begun: stop taking new partitions.
func (c *coordinator) run(ctx, workCtx context.Context, broadcast func()) {
	r := c.r
	retry := r.newRetrier()
	var cut cutOff
	var eager eagerRounds
	for {
		wait := r.cfg.HeartbeatInterval
		if cut.check(ctx, r) {
			wait = min(wait, r.cfg.LeaseTTL/4) // notice the way back soon
		}
		var changed <-chan struct{} // a stream's Hold: its answer changed
		var err error
		if r.caps.stream != nil {
			changed, err = c.streamRound(ctx, workCtx.Err() != nil, cut.on)
		} else {
			err = c.leaseRound(ctx, workCtx.Err() != nil, cut.on)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := retry.failed()
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("coordinator round failed", "err", err, "failures", retry.failures, "retry_in", d)
			wait = min(wait, d)
		} else {
			retry.ok()
			broadcast()
			if r.caps.stream == nil && eager.next(c.round) {
				wait = min(wait, eagerRoundInterval)
			}
		}
		// Wait for the next round, releasing drained partitions meanwhile,
		// so that the relay taking them over need not wait a round.
		t := time.NewTimer(wait)
	sleep:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break sleep
			case <-changed:
				t.Stop()
				break sleep
			case <-r.reports.signal:
				c.applyReportsOrLog(ctx)
			}
		}
	}
}

// heldLease is a partition lease the relay holds.
type heldLease struct {
	Lease
	validUntil time.Time // local monotonic time after which no publish may start
	// shed: surplus being handed back to another relay. The lease is
	// renewed, but its worker starts nothing new for it; once nothing is in
	// flight or waiting to be settled, the coordinator releases it. (Released
	// at once, a publish in flight would be published again by the next
	// owner, and its settlement lost.)
	shed bool
}

// leaseReports carries what workers tell the coordinator about leases:
// partitions being handed back that are drained (nothing in flight or
// waiting to be settled), and leases a settle found fenced. Workers never
// block on it; signal wakes the coordinator.
type leaseReports struct {
	mu      sync.Mutex
	drained map[int]int64 // partition → epoch
	fenced  []Lease
	signal  chan struct{}
}

func newLeaseReports() leaseReports {
	return leaseReports{drained: map[int]int64{}, signal: make(chan struct{}, 1)}
}

func (lr *leaseReports) wake() {
	select {
	case lr.signal <- struct{}{}:
	default:
	}
}

// shedDrained reports that the partition of l, being handed back, is
// drained. Cheap and idempotent: workers call it on every loop.
func (lr *leaseReports) shedDrained(l Lease) {
	lr.mu.Lock()
	e, ok := lr.drained[l.Partition]
	lr.drained[l.Partition] = l.Epoch
	lr.mu.Unlock()
	if !ok || e != l.Epoch {
		lr.wake()
	}
}

// lost reports leases a settle found fenced: another relay holds them.
func (lr *leaseReports) lost(ls []Lease) {
	lr.mu.Lock()
	lr.fenced = append(lr.fenced, ls...)
	lr.mu.Unlock()
	lr.wake()
}

func (lr *leaseReports) take() (drained map[int]int64, fenced []Lease) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	drained, fenced = lr.drained, lr.fenced
	lr.drained, lr.fenced = map[int]int64{}, nil
	return drained, fenced
}

// applyReports drops the fenced leases and releases the drained ones
// being handed back: they leave the relay's set first, so nothing new
// starts, then the store frees them for another relay.
func (c *coordinator) applyReports(ctx context.Context) error {
	r := c.r
	drained, fenced := r.reports.take()
	changed := false
	for _, l := range fenced {
		if h, ok := c.leases[l.Partition]; ok && h.Epoch == l.Epoch {
			delete(c.leases, l.Partition)
			changed = true
		}
	}
	var release []Lease
	for p, epoch := range drained {
		if h, ok := c.leases[p]; ok && h.shed && h.Epoch == epoch {
			release = append(release, h.Lease)
			delete(c.leases, p)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	held := len(c.leases)
	r.nLeases.Store(int64(held))
	c.sendLeases()
	r.emit(Event{Kind: EventLeases, Count: held})
	if len(release) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.HeartbeatInterval, r.cfg.LeaseTTL/3))
	defer cancel()
	if r.caps.stream != nil {
		return c.releaseStream(ctx, held)
	}
	if err := r.caps.leases.ReleaseLeases(ctx, r.cfg.Node, release); err != nil {
		// They expire by themselves; meanwhile no other relay can take them.
		return fmt.Errorf("release leases: %w", err)
	}
	r.log.Info("handed back leases", "partitions", len(release))
	return nil
}

// sendLeases gives every worker a snapshot of its partitions' leases, the
// latest replacing one not yet taken.
func (c *coordinator) sendLeases() {
	r := c.r
	snaps := make([]map[int]heldLease, len(r.workers))
	for i := range snaps {
		snaps[i] = map[int]heldLease{}
	}
	for p, h := range c.leases {
		snaps[p%len(snaps)][p] = *h
	}
	for i, w := range r.workers {
		w.leases.Store(&snaps[i]) // replaces one not yet taken
		r.wake(i)
	}
}

// leaseRound is one heartbeat: register, renew, shed or take leases.
// With cutOff (the broker unreachable for a lease TTL), the relay does not
// heartbeat, so other relays stop counting it, and hands every lease back.
func (c *coordinator) leaseRound(ctx context.Context, shuttingDown, cutOff bool) error {
	r := c.r
	ttl := r.cfg.LeaseTTL
	// A slow round only shortens the publishing window (validity counts
	// from its start), so it may take up to a third of the TTL.
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.HeartbeatInterval, ttl/3))
	defer cancel()
	start := time.Now()
	live, share := 0, 0
	if !cutOff {
		var err error
		if live, err = r.caps.leases.Heartbeat(ctx, r.cfg.Node, ttl); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		live = max(live, 1)
		share = (r.partitions + live - 1) / live
	}
	held := c.heldLeases()
	want := 0
	if !shuttingDown {
		want = max(0, share-len(held))
	}
	got, err := r.caps.leases.AcquireLeases(ctx, r.cfg.Node, held, want, ttl)
	if err != nil {
		return fmt.Errorf("acquire leases: %w", err)
	}
	c.round = roundResult{live: live, short: want > 0 && len(got) < len(held)+want}
	// The store set expiry to its now+ttl, no earlier than our start+ttl.
	// Stop starting publishes early enough that one in flight ends first.
	validUntil := start.Add(ttl - r.cfg.PublishTimeout)
	// Leases over the fair share are handed back in two steps: marked shed
	// now (renewed, nothing new starts), released once drained.
	var keep, shed []Lease
	for _, l := range got {
		if old, ok := c.leases[l.Partition]; ok && old.Epoch == l.Epoch && old.shed {
			shed = append(shed, l)
		} else {
			keep = append(keep, l)
		}
	}
	if shuttingDown && !cutOff {
		keep, shed = append(keep, shed...), nil // Leave releases them all
	} else if len(keep) > share {
		shed = append(shed, keep[share:]...)
		keep = keep[:share]
	} else if n := min(share-len(keep), len(shed)); n > 0 {
		keep = append(keep, shed[:n]...) // the share grew again: keep them
		shed = shed[n:]
	}
	next := make(map[int]*heldLease, len(got))
	changed := len(got) != len(c.leases)
	for i, l := range slices.Concat(keep, shed) {
		old, ok := c.leases[l.Partition]
		h := &heldLease{Lease: l, validUntil: validUntil, shed: i >= len(keep)}
		if !ok || old.Epoch != l.Epoch || old.shed != h.shed {
			changed = true
		}
		next[l.Partition] = h
	}
	c.leases = next
	c.sendLeases() // validity changed at least
	if changed {
		r.log.Info("leases", "held", len(keep), "handing_back", len(shed), "live_relays", live, "share", share)
	}
	r.nLeases.Store(int64(len(got)))
	r.emit(Event{Kind: EventLeases, Count: len(got)})
	r.beat()
	c.applyReportsOrLog(ctx)
	return nil
}

// applyReportsOrLog applies the workers' reports; a failure to release is
// logged (those leases have left the relay's set already and expire by
// themselves within LeaseTTL).
func (c *coordinator) applyReportsOrLog(ctx context.Context) {
	r := c.r
	if err := c.applyReports(ctx); err != nil && ctx.Err() == nil {
		r.emit(Event{Kind: EventStoreError, Err: err})
		r.log.Warn("releasing drained leases failed; they expire by themselves", "err", err, "lease_ttl", r.cfg.LeaseTTL)
	}
}

func (c *coordinator) heldLeases() []Lease {
	out := make([]Lease, 0, len(c.leases))
	for _, l := range c.leases {
		out = append(out, l.Lease)
	}
	return out
}

// cutOff tracks whether the relay has been unable to reach its broker for a
// lease TTL: it then hands its partitions back (and stops heartbeating, so
// that other relays take them at once) until the broker is reachable again.
// Only publishers that implement [HealthChecker] are judged: a blocked
// destination alone (a deleted stream) must not make every relay give up.
type cutOff struct {
	since time.Time // first failed check of the current outage, or zero
	on    bool
}

// check runs the health check and returns whether the relay is cut off.
func (c *cutOff) check(ctx context.Context, r *Relay) bool {
	hc := r.caps.health
	if hc == nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	err := hc.Health(hctx)
	cancel()
	now := time.Now()
	if err == nil {
		if c.on {
			r.log.Info("broker reachable again: taking partitions again", "cut_off_for", now.Sub(c.since).Round(time.Millisecond))
		}
		c.since, c.on = time.Time{}, false
		return false
	}
	if ctx.Err() != nil {
		return c.on
	}
	if c.since.IsZero() {
		c.since = now
		r.log.Warn("broker unreachable; partitions are handed back if it lasts a lease TTL", "err", err, "lease_ttl", r.cfg.LeaseTTL)
	}
	if !c.on && now.Sub(c.since) >= r.cfg.LeaseTTL {
		c.on = true
		r.log.Warn("cut off from the broker for a lease TTL: handing every partition back to relays that can publish", "err", err, "since", c.since)
		// Stop counting as a live relay now, not when the heartbeat expires.
		// (A stream is released once what is in flight is settled: see
		// streamRound.)
		if l := r.caps.leases; l != nil {
			lctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			if err := l.Leave(lctx, r.cfg.Node, nil); err != nil {
				r.log.Warn("removing the heartbeat failed; it expires by itself", "err", err)
			}
			cancel()
		}
	}
	return c.on
}

// eagerRoundInterval is how often a relay below its fair share tries to
// take partitions while they are being handed back to it.
const eagerRoundInterval = 200 * time.Millisecond

// roundResult is what the coordinator learns from a lease round.
type roundResult struct {
	live  int  // relays alive
	short bool // fewer partitions were free than the fair share wanted
}

// eagerRounds makes the lease rounds frequent for a while when the number
// of live relays changed and this relay is below its share: the relays
// above theirs hand partitions back as soon as their publishes in flight
// are settled, and the joining relay takes them within eagerRoundInterval
// instead of a heartbeat later. The budget (40 eager rounds, about 8 s,
// per change) keeps a relay that can never reach its share
// (64 partitions over 3 relays) from polling forever.
type eagerRounds struct {
	live    int
	budget  int
	started int // rounds since start, up to startEagerRounds
}

// startEagerRounds is how many rounds after start come every
// eagerRoundInterval, whatever the share: relays started together (a
// deployment) see each other within a fifth of a second, so the first to
// take every partition hands the others their share at once instead of a
// heartbeat later.
const startEagerRounds = 10

// next reports whether the next round should come early.
func (e *eagerRounds) next(last roundResult) bool {
	if e.started < startEagerRounds {
		e.started++
		return true
	}
	if last.live != e.live {
		e.live = last.live
		e.budget = 40
	}
	if !last.short || e.budget <= 0 {
		return false
	}
	e.budget--
	return true
}
