package outbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// worker is one goroutine of key mode: it runs a capture side (the
// partition-lease poller, capture.go) and the publishing pipeline
// (pipeline.go) for the partitions p with p % Workers == index that the
// relay holds. Its loop is the only goroutine touching their state: reads,
// publishes and settlement writes run beside it, and their results come
// back on one channel of events, applied by one select.
type worker struct {
	r     *Relay
	index int
	wake  <-chan struct{} // notifications, and a new lease snapshot

	// leases is the coordinator's latest snapshot of this worker's leases
	// (latest wins: the coordinator replaces one not yet taken, then wakes
	// the worker); fenced holds the leases a settle found fenced until a
	// snapshot no longer has them.
	leases atomic.Pointer[map[int]heldLease]
	fenced map[int]int64

	// events brings every result of work done beside the loop: publishes,
	// settles, fetches and sweeps (see workerEvent).
	events  chan workerEvent
	pipe    *pipeline
	capture *poller

	storeRetry retrier
	retryStore time.Time // no store call before this after a failure

	// drainTo: on a graceful stop with a store that confirms a prefix
	// (StreamStore), the worker publishes its partitions' records up
	// to this Seq that can go at once before it leaves (see drain); -1
	// once done or when there is nothing to drain.
	drainTo int64
	// drainBy is when a drain stops waiting for retries: ShutdownTimeout
	// after the stop began, less a publish's time.
	drainBy time.Time
}

func newWorker(r *Relay, index int, wake <-chan struct{}) *worker {
	w := &worker{
		r:     r,
		index: index,
		wake:  wake,
		// At most InFlight publishes, one settle, one fetch and one sweep
		// step are under way: their results never block the sender.
		events:     make(chan workerEvent, r.cfg.InFlight+3),
		fenced:     map[int]int64{},
		storeRetry: r.newRetrier(),
	}
	w.capture = newPoller(r, index, w.events, w.storeFailed, w.storeOK)
	w.pipe = newPipeline(r, w.capture, w.events)
	w.capture.pipe = w.pipe
	return w
}

// run loops until ctx ends, then finishes the publishes in flight and
// settles them (unless killCtx ends first).
func (w *worker) run(ctx, killCtx context.Context) {
	defer w.pipe.startSettler(killCtx)()
	done := ctx.Done()
	for {
		w.absorb(ctx)
		if !w.pipe.stopping && ctx.Err() != nil && w.drainTo <= 0 {
			w.drainBy = time.Now().Add(w.r.cfg.ShutdownTimeout - w.r.cfg.PublishTimeout)
			// Shutdown: nothing new starts; wait for what is in flight,
			// then settle it at once.
			w.pipe.stopping = true
			done = nil
		}
		w.pipe.startSettle()
		var timer *time.Timer
		var timeout <-chan time.Time
		if w.pipe.stopping {
			if !w.busy() {
				if !w.drain(killCtx) {
					return
				}
				continue
			}
		} else {
			wctx := ctx
			if w.drainTo > 0 {
				wctx = killCtx // draining: ctx has ended
			}
			if w.work(wctx, killCtx) {
				continue
			}
			wait := w.nextWake(time.Now())
			if w.drainTo > 0 && w.drained() {
				// The barrier's transaction may not have been read whole
				// (a large one, published while it is read): its later
				// records raise the barrier; drain to it until it is
				// complete or the deadline comes.
				upTo, complete := w.r.caps.stream.StopBarrier()
				switch {
				case upTo > w.drainTo:
					w.extendDrain(upTo)
					continue
				case complete || !time.Now().Before(w.drainBy):
					w.drainTo = -1
					w.pipe.stopping = true // settle what the drain published, then leave
					continue
				}
				wait = min(wait, drainPoll) // the rest of the transaction comes
			}
			// Nothing to do now: wait for a result, a wake-up or a timer.
			timer = time.NewTimer(wait)
			timeout = timer.C
		}
		select {
		case ev := <-w.events:
			ev.apply(ctx, w)
		case <-w.wake: // refill reads what the notification asked for
		case <-timeout:
		case <-done:
		case <-killCtx.Done():
			return // abandoned: the messages stay in the outbox
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// absorb applies, without waiting, what is ready: the latest lease
// snapshot and the events already waiting (the loop is their only
// receiver, so taking len of them never blocks). While running it first
// tells the coordinator which partitions being handed back are drained.
func (w *worker) absorb(ctx context.Context) {
	if !w.pipe.stopping {
		w.pipe.drained(w.r.reports.shedDrained)
		if snap := w.leases.Swap(nil); snap != nil {
			w.syncLeases(*snap)
		}
	}
	for range len(w.events) {
		(<-w.events).apply(ctx, w)
	}
}

// work starts what can start now: a sweep, a fetch and publishes. It
// reports whether it launched publishes (the loop then looks again at
// once).
func (w *worker) work(ctx, killCtx context.Context) bool {
	now := time.Now()
	if now.Before(w.retryStore) {
		return false // the store failed recently: wait before touching it again
	}
	// The sweep runs on its own schedule, whatever the load, so a late
	// record waits at most about SweepInterval.
	if w.capture.shouldSweep(now) {
		w.capture.sweep(ctx)
	}
	if !w.pipe.canStart() {
		return false
	}
	w.capture.refill(ctx)
	batches := w.pipe.build(w.r.cfg.Now())
	if len(batches) == 0 {
		return false
	}
	deadline := time.Now().Add(w.r.cfg.PublishTimeout)
	for _, b := range batches {
		w.pipe.launch(killCtx, b, deadline)
	}
	return true
}

// drain is called on a graceful stop once nothing is in flight or waits to
// be written. With a store that confirms settlements as a log position
// (a StreamStore, the WAL capture), records settled past an unsettled
// one would be published again by the next reader: every worker waits
// for the others to be as far (stopBarrier), then the relay asks the store
// up to which Seq records must be settled, and the worker publishes its
// partitions' records up to there, as when running (key order, batches,
// retries' outcomes), until none is left that can go before the stop's
// deadline. Records waiting for a blocked destination, or for a retry due
// later than ShutdownTimeout allows, are not waited for: they, and what
// was published past them, are published again by the next reader (the
// store logs how many). It reports whether the worker drains
// (the loop runs on, restricted to those records).
func (w *worker) drain(killCtx context.Context) bool {
	if w.drainTo != 0 || w.r.caps.stream == nil {
		return false
	}
	w.drainTo = -1
	upTo, ok := w.r.stopGap.wait(killCtx, func() int64 {
		seq, _ := w.r.caps.stream.StopBarrier()
		return seq
	})
	if !ok || upTo <= 0 || len(w.pipe.lanes) == 0 {
		return false
	}
	w.extendDrain(upTo)
	w.pipe.stopping = false
	w.pipe.draining = true
	return true
}

// drainPoll is how often a drained worker asks the store again for the
// stop barrier while the barrier's transaction is still being read.
const drainPoll = 5 * time.Millisecond

// extendDrain makes the worker drain its partitions up to upTo.
func (w *worker) extendDrain(upTo int64) {
	w.drainTo = upTo
	w.capture.drainTo = upTo
	for _, ln := range w.pipe.lanes {
		ln.q.upTo = upTo // records queued before the stop past it stay unpublished
	}
	for _, cs := range w.capture.parts {
		cs.caughtUp = false
	}
	w.capture.quiet = false
}

// drained reports whether a draining worker has nothing left to do: every
// partition read up to drainTo, nothing in flight or waiting to be written,
// and no retry due before drainBy (work, just called, started nothing: what
// is queued waits for a later retry or a blocked destination).
func (w *worker) drained() bool {
	if w.capture.fetching || w.capture.sweeping || w.pipe.busy() || w.pipe.retryDueBefore(w.drainBy) {
		return false
	}
	for _, cs := range w.capture.parts {
		if !cs.caughtUp {
			return false
		}
	}
	return true
}

// stopBarrier makes the workers of a stopping relay wait for each other
// before one of them asks the store where to drain to: a worker's
// settlements written after that would move the answer.
type stopBarrier struct {
	mu   sync.Mutex
	left int
	done chan struct{}
	upTo int64
}

func newStopBarrier(workers int) *stopBarrier {
	return &stopBarrier{left: workers, done: make(chan struct{})}
}

// wait counts the caller in and waits for the others (or ctx); the last
// one in calls barrier, whose answer every caller gets.
func (b *stopBarrier) wait(ctx context.Context, barrier func() int64) (int64, bool) {
	b.mu.Lock()
	if b.left--; b.left == 0 {
		b.upTo = barrier()
		close(b.done)
	}
	b.mu.Unlock()
	select {
	case <-b.done:
		return b.upTo, true
	case <-ctx.Done():
		return 0, false
	}
}

// busy reports whether anything is in flight or waits to be written.
func (w *worker) busy() bool {
	return w.pipe.busy() || w.capture.fetching || w.capture.sweeping
}

// workerEvent is the result of work done beside the worker's loop, applied
// by the loop (the only goroutine touching the worker's state).
type workerEvent interface {
	apply(ctx context.Context, w *worker)
}

func (res publishResult) apply(_ context.Context, w *worker) { w.pipe.handle(res) }
func (res settleResult) apply(_ context.Context, w *worker)  { w.settled(res) }

func (res fetchResult) apply(_ context.Context, w *worker) {
	if w.pipe.stopping {
		w.capture.fetching = false // shutting down: drop it
		return
	}
	w.capture.fetched(res)
}

func (res sweepResult) apply(ctx context.Context, w *worker) {
	if w.pipe.stopping {
		w.capture.sweeping = false
		return
	}
	w.capture.swept(ctx, res)
}

// nextWake is how long an idle worker may sleep. While the store backs
// off, work starts nothing (no poll, sweep or publish), so only the end of
// the backoff and settlements coming due can wake it: an overdue poll or a
// due retry used to wake it every millisecond until then.
func (w *worker) nextWake(now time.Time) time.Duration {
	if now.Before(w.retryStore) {
		return max(w.pipe.settleDue(now, w.retryStore.Sub(now)), time.Millisecond)
	}
	d := w.capture.nextWake(now, w.r.cfg.PollInterval, w.pipe.canStart())
	d = w.pipe.nextWake(now, d)
	return max(d, time.Millisecond)
}

// syncLeases brings the worker's partitions in line with the
// coordinator's latest snapshot of their leases.
func (w *worker) syncLeases(snap map[int]heldLease) {
	for p, e := range w.fenced {
		if h, ok := snap[p]; !ok || h.Epoch != e {
			delete(w.fenced, p) // the snapshot knows it is gone
		} else {
			delete(snap, p) // sent before the coordinator heard of it
		}
	}
	for p, ln := range w.pipe.lanes {
		if h, ok := snap[p]; !ok || h.Epoch != ln.lease.Epoch {
			w.pipe.close(p) // its unwritten settlements would be fenced anyway
			w.capture.close(p)
		}
	}
	for _, h := range snap {
		w.pipe.open(h)
		w.capture.open(h.Lease)
	}
	w.pipe.reorder()
	w.capture.reorder()
}

// settled applies what the settler wrote; partitions whose lease the store
// found fenced are dropped and reported to the coordinator.
func (w *worker) settled(res settleResult) {
	w.pipe.settled(res)
	if len(res.fenced) == 0 {
		return
	}
	w.drop(res.fenced)
}

// drop closes both sides of leases a settle found fenced, and tells the
// coordinator.
func (w *worker) drop(fenced []Lease) {
	r := w.r
	r.fenced.Add(int64(len(fenced)))
	r.emit(Event{Kind: EventFenced, Count: len(fenced)})
	r.log.Warn("partitions lost to another relay", "leases", fenced)
	r.reports.lost(fenced)
	for _, l := range fenced {
		w.fenced[l.Partition] = l.Epoch
		if ln := w.pipe.lanes[l.Partition]; ln != nil && ln.lease.Epoch == l.Epoch {
			w.pipe.close(l.Partition)
			w.capture.close(l.Partition)
		}
	}
	w.pipe.reorder()
	w.capture.reorder()
}

// storeFailed backs off store calls after an error.
func (w *worker) storeFailed(op string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	d := w.storeRetry.failed()
	w.retryStore = time.Now().Add(d)
	w.r.emit(Event{Kind: EventStoreError, Err: err})
	w.r.log.Warn("store call failed", "op", op, "err", err, "retry_in", d)
}

func (w *worker) storeOK() {
	w.storeRetry.ok()
	w.retryStore = time.Time{}
}
