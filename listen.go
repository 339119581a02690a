package outbox

import (
	"context"
	"time"
)

// Notification routing: store notifications wake the workers owning the
// partitions written.

// wake nudges worker i, without blocking.
func (r *Relay) wake(i int) {
	select {
	case r.wakes[i] <- struct{}{}:
	default:
	}
}

// notifyAll makes every worker fetch all its partitions. With ordering
// none it wakes one worker, in turn: workers claim any rows, and a worker
// whose claim comes back full wakes the next (see runUnordered), so one
// small transaction costs one claim, not one per worker.
func (r *Relay) notifyAll() {
	if r.cfg.Ordering == OrderingNone {
		r.wakeOneUnordered()
		return
	}
	r.notified.Store(int32(len(r.wakes)))
	for i := range r.wakes {
		r.fetchAll[i].Store(true)
		r.wake(i)
	}
}

// wakeOneUnordered wakes an idle worker of ordering none, taking them in
// turn; with none idle, the next in turn (its wake-up waits in its channel:
// it claims again when its batch is done, so none is lost; busy workers
// claim again anyway).
func (r *Relay) wakeOneUnordered() {
	n := len(r.wakes)
	start := int(r.turn.Add(1) % uint64(n))
	for k := range n {
		if i := (start + k) % n; r.idle[i].Load() {
			r.wake(i)
			return
		}
	}
	r.wake(start)
}

// notifyPartitions makes the workers owning ps fetch those partitions
// (with ordering none, one worker claims).
func (r *Relay) notifyPartitions(ps []int) {
	if r.cfg.Ordering == OrderingNone {
		r.wakeOneUnordered()
		return
	}
	woken := make([]bool, r.cfg.Workers)
	n := 0
	for _, p := range ps {
		if p < 0 || p >= len(r.dirty) {
			continue
		}
		r.dirty[p].Store(true)
		if i := p % r.cfg.Workers; !woken[i] {
			woken[i] = true
			n++
		}
	}
	r.notified.Store(int32(n))
	for i, ok := range woken {
		if ok {
			r.dirtied[i].Store(true) // after its dirty flags (see refill)
			r.wake(i)
		}
	}
}

// notifyGather is how long the first worker woken by a notification that
// woke several waits for the others' fetches, so that they make one
// statement: a commit of ten messages wakes up to every worker, and
// without it about half of them came too late for the first fetch. It
// stops waiting as soon as every worker woken came.
const notifyGather = 300 * time.Microsecond

// listenPollFactor stretches PollInterval while the relay is subscribed
// to notifications: they announce every write within milliseconds, and
// the poll only finds what none announced (rows inserted by other means
// than Write). An idle relay then makes about one query a second.
const listenPollFactor = 4

// pollInterval is how often idle workers poll now.
func (r *Relay) pollInterval() time.Duration {
	if r.listening.Load() {
		return listenPollFactor * r.cfg.PollInterval
	}
	return r.cfg.PollInterval
}

// listen forwards store notifications to the workers, resubscribing after
// failures (meanwhile the workers poll). Notifications naming partitions
// reach only the workers owning them; nil means any partition.
func (r *Relay) listen(ctx context.Context) {
	pn := r.caps.notifier
	if pn == nil {
		return
	}
	retry := r.newRetrier()
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			// Writes committed while unsubscribed were not notified.
			r.notifyAll()
		}
		err := pn.SubscribePartitions(ctx, func(ps []int) {
			// Subscribed (stores call fn(nil) once they are): polls are
			// now only a safety net.
			r.listening.Store(true)
			if ps == nil {
				r.notifyAll()
			} else {
				r.notifyPartitions(ps)
			}
		})
		if r.listening.Swap(false) {
			retry.ok() // it was subscribed: the next failure waits from StoreRetryMin again
		}
		if err != nil && ctx.Err() == nil {
			r.log.Debug("subscription failed; polling", "err", err)
		}
		if !sleepCtx(ctx, retry.failed()) {
			return
		}
	}
}
