package outbox

import (
	"context"
	"time"
)

// The SKIP LOCKED claim: the capture side of ordering none. A claim holds
// its rows locked in an open transaction until it is settled, and its
// records have no key order to keep, so it does not go through the
// pipeline's per-key FIFOs and settlement batching (pipeline.go): those
// would hold the locks across other claims' publishes or keep a record
// for its retry inside a claim. It uses the pipeline's publish and
// outcome steps (publish, observe, outcome, report in outcome.go) and
// settles each claim in its own transaction; a failed settle rolls the
// claim back, to be claimed and published again.

// runUnordered is worker i of OrderingNone: claim with row locks,
// publish, settle and commit, again and again. When a claim finds nothing,
// the worker waits for a notification (which wakes one worker, in turn);
// worker 0 alone also polls, so that an idle relay makes one claim per
// poll, not one per worker. A claim that comes back full wakes the next
// worker: a backlog is drained by every worker at once.
func (r *Relay) runUnordered(ctx, killCtx context.Context, i int) {
	us := r.caps.unordered
	wake := r.wakes[i]
	retry, blockedRounds := r.newRetrier(), 0
	for ctx.Err() == nil {
		claim, err := us.ClaimUnordered(ctx, r.cfg.BatchSize)
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
		msgs := make([]*Message, len(recs))
		ptrs := make([]*Record, len(recs))
		for i := range recs {
			msgs[i] = &recs[i].Message
			ptrs[i] = &recs[i]
		}
		pctx, cancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
		start := time.Now()
		errs := r.publish(pctx, ptrs, msgs)
		cancel()
		took := time.Since(start)
		now := r.cfg.Now()
		var s Settlement
		outcomes := make([]int, len(ptrs))
		nBlocked := 0
		for i, rec := range ptrs {
			r.observe(rec, errs[i], now)
			if outcomes[i] = r.outcome(rec, errs[i], now, &s); outcomes[i] == outcomeBlocked {
				nBlocked++ // left as it is: claimed again after a pause
			}
		}
		sctx, scancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
		start = time.Now()
		err = claim.Settle(sctx, s)
		scancel()
		if err != nil {
			_ = claim.Release(killCtx)
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("settle failed; the batch will be published again", "err", err)
			continue
		}
		r.emit(Event{Kind: EventSettled, Count: len(recs), Duration: time.Since(start)})
		r.report(ptrs, outcomes, errs, took, now)
		if nBlocked == len(recs) {
			// Every message's destination is blocked: pause like a probe
			// instead of claiming the same rows again at once.
			blockedRounds++
			sleepCtx(ctx, Backoff(blockedRounds, blockedProbeMin, blockedProbeMax))
		} else {
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
