package outbox

import (
	"context"
	"time"
)

// The SKIP LOCKED claim: the capture side of ordering none. A claim holds
// its rows locked in an open transaction until it is settled, and its
// records have no key order to keep. Each claim is fed to a pipeline in
// claims mode (pipeline.go, publishAll): every record is published once,
// in one Publish call, its outcome decided as in key mode (retry with
// backoff, dead letter, blocked destination), and the claim's settlements
// come back to the claim to be written in its transaction. A failed
// settle rolls the claim back, to be claimed and published again.

// claimSource is the claim as the pipeline's capture side.
type claimSource struct {
	r       *Relay
	claim   Claim
	claimed int  // records in the claim
	settled int  // of those, records the written settlement carried
	failed  bool // the settle failed: the claim was rolled back
}

// begin makes claim the one the pipeline's settlements go to.
func (c *claimSource) begin(claim Claim, n int) {
	c.claim, c.claimed, c.settled, c.failed = claim, n, 0, false
}

// writeSettlements writes the claim's settlements in its transaction and
// commits it, once: on failure it rolls back, and the claimed records
// are claimed again later (rolledBack).
func (c *claimSource) writeSettlements(killCtx context.Context, batch []Settlement, _ time.Duration) (fenced []Lease, rolledBack bool) {
	r := c.r
	var s Settlement
	for _, b := range batch {
		s.Delivered = append(s.Delivered, b.Delivered...)
		s.Retry = append(s.Retry, b.Retry...)
		s.Dead = append(s.Dead, b.Dead...)
	}
	ctx, cancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
	start := time.Now()
	err := c.claim.Settle(ctx, s)
	cancel()
	if err != nil {
		_ = c.claim.Release(killCtx)
		c.failed = true
		r.emit(Event{Kind: EventStoreError, Err: err})
		r.log.Warn("settle failed; the batch will be published again", "err", err)
		return nil, true
	}
	c.settled = len(s.Delivered) + len(s.Retry) + len(s.Dead)
	r.emit(Event{Kind: EventSettled, Count: c.claimed, Duration: time.Since(start)})
	return nil, false
}

// A claim's records are settled in its transaction, and none stays in
// memory after it: nothing to remember, nothing to read again.
func (c *claimSource) gone(string)                    {}
func (c *claimSource) dropped(int, string, []*Record) {}
func (c *claimSource) recovered(int, string)          {}

// runUnordered is worker i of OrderingNone: claim with row locks,
// publish, settle and commit, again and again. When a claim finds nothing,
// the worker waits for a notification (which wakes one worker, in turn);
// worker 0 alone also polls, so that an idle relay makes one claim per
// poll, not one per worker. A claim that comes back full wakes the next
// worker: a backlog is drained by every worker at once.
func (r *Relay) runUnordered(ctx, killCtx context.Context, i int) {
	us := r.caps.unordered
	wake := r.wakes[i]
	src := &claimSource{r: r}
	pipe := newClaimsPipeline(r, src)
	retry, blockedRounds := r.newRetrier(), 0
	for ctx.Err() == nil {
		claim, err := us.ClaimUnordered(ctx, r.cfg.BatchSize, r.dests.paused(r.cfg.Now()))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := retry.failed()
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("claim failed", "err", err, "retry_in", d)
			sleepCtx(ctx, d)
			continue
		}
		retry.ok()
		r.beat()
		recs := claim.Records()
		if len(recs) == 0 {
			_ = claim.Release(killCtx)
			r.idleUnordered(ctx, i, wake)
			continue
		}
		if len(recs) == r.cfg.BatchSize {
			// More may be waiting: let the next worker claim meanwhile.
			r.wake((i + 1) % len(r.wakes))
		}
		src.begin(claim, len(recs))
		now := r.cfg.Now()
		for j := range recs {
			pipe.feed(&recs[j], now)
		}
		if !pipe.publishAll(killCtx) {
			_ = claim.Release(killCtx) // killed: abandoned
			return
		}
		switch {
		case src.failed: // rolled back: claimed again
		case src.settled == 0:
			// Every message's destination is blocked: pause like a probe
			// instead of claiming the same rows again at once.
			blockedRounds++
			sleepCtx(ctx, Backoff(blockedRounds, blockedProbeMin, blockedProbeMax))
		default:
			blockedRounds = 0
		}
	}
}

// idleUnordered waits for a notification, and for worker 0 also for the
// next poll.
func (r *Relay) idleUnordered(ctx context.Context, i int, wake <-chan struct{}) {
	var poll <-chan time.Time
	if i == 0 {
		t := time.NewTimer(r.pollInterval())
		defer t.Stop()
		poll = t.C
	}
	r.idle[i].Store(true)
	defer r.idle[i].Store(false)
	select {
	case <-ctx.Done():
	case <-wake:
	case <-poll:
	}
}
