package outbox

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"
)

// minSplitBatch is the smallest batch the worker splits its eligible
// records into when it has several publish slots free.
const minSplitBatch = 16

// markedSweepInterval is the least time between sweeps with a store that
// implements MarkedFetcher, whose fetches already return late commits.
var markedSweepInterval = 30 * time.Second

// worker publishes the partitions p with p % Workers == index that the
// relay holds. All of its state is owned by its goroutine.
type worker struct {
	r     *Relay
	index int
	wake  <-chan struct{}

	parts map[int]*partState
	order []int // partitions in round-robin order
	next  int   // round-robin start
	// leaseIn brings the coordinator's snapshots of this worker's leases
	// (latest wins); fenced holds the leases a settle found fenced until a
	// snapshot no longer has them.
	leaseIn chan map[int]heldLease
	fenced  map[int]int64

	inflight int  // Publish calls in flight
	shedding bool // some partition is being handed back
	// events brings every result of work done beside the loop: publishes,
	// settles, fetches and sweeps (see workerEvent).
	events  chan workerEvent
	settle  map[int]*Settlement // per partition, waiting to be written
	settleN int
	// A fetch runs beside the publishing.
	fetching bool // a fetch is in flight

	// The settler goroutine writes one batch of settlements at a time, so
	// the worker publishes on while the store deletes.
	settleSince time.Time // when the oldest queued settlement came
	stopping    bool      // shutting down: settle at once
	settleJobs  chan settleJob
	settlerBusy bool
	settlerN    int // settlements in the batch the settler is writing

	lastSweep time.Time
	// A sweep runs beside the publishing too, in two steps (Unsettled,
	// then Fetch of the late records).
	sweeping   bool
	sweepStart time.Time
	fetchStart time.Time
	// gone holds the IDs whose delivery or dead-lettering was written while
	// a fetch or sweep was in flight, with when: a read that started before
	// may still return them, and must not queue them again.
	gone map[string]time.Time
	// lastPoll is when the worker last fetched every partition it holds,
	// notified or not: a partition whose notification was lost is found
	// within PollInterval even while other partitions keep being notified.
	lastPoll   time.Time
	storeRetry retrier
	retryStore time.Time // no store call before this after a failure
}

// partState is what a worker knows of one leased partition.
type partState struct {
	lease      Lease
	validUntil time.Time
	cursor     int64              // highest Seq fetched
	mark       string             // the MarkedFetcher mark of the fetch that set cursor
	q          partQueue          // fetched, not in flight, per key in commit (fetch) order
	inflight   map[string]*Record // by ID
	// settling counts, per ID, the settlements queued or being written: a
	// record can have a retry being written and its delivery queued.
	settling map[string]int
	// deadHeld are records dead-lettered in memory whose settlement is not
	// written yet: their keys stay held until it is, so that if it is never
	// written (fenced, shed) no later record of the key goes first.
	deadHeld map[string]*Record
	caughtUp bool // the last fetch returned everything there was
	// high is the highest Seq ever fetched; cursor is below it after a
	// rewind, and records between them may be known already.
	high int64
	// trunc holds, per failing key whose records were dropped from memory,
	// the Seq after which they were dropped: records of the key above it
	// are not queued until the key recovers, and then the cursor rewinds
	// there (rewindTo) to read them again, in order.
	trunc    map[string]int64
	rewind   bool
	rewindTo int64
	// recov holds the keys that recovered since the last rewind: their
	// truncation ends when the rewound fetch is issued, so that a fetch
	// already in flight cannot queue a record of theirs before the records
	// the rewind reads.
	recov map[string]bool
	// shed: the relay is handing this partition back; nothing new starts
	// and, once nothing is in flight or settling, the worker says so.
	shed bool
}

type settleResult struct {
	batch  []Settlement
	fenced []Lease
}

type publishResult struct {
	recs []*Record
	errs []error
	took time.Duration
}

func newWorker(r *Relay, index int, wake <-chan struct{}) *worker {
	return &worker{
		r:     r,
		index: index,
		wake:  wake,
		parts: map[int]*partState{},
		// At most InFlight publishes, one settle, one fetch and one sweep
		// step are under way: their results never block the sender.
		events:     make(chan workerEvent, r.cfg.InFlight+3),
		leaseIn:    make(chan map[int]heldLease, 1),
		fenced:     map[int]int64{},
		settle:     map[int]*Settlement{},
		settleJobs: make(chan settleJob),
		gone:       map[string]time.Time{},
		storeRetry: r.newRetrier(),
	}
}

// run loops until ctx ends, then finishes the publishes in flight and
// settles them (unless killCtx ends first).
func (w *worker) run(ctx, killCtx context.Context) {
	settlerDone := make(chan struct{})
	go func() {
		defer close(settlerDone)
		w.settler(killCtx)
	}()
	defer func() {
		close(w.settleJobs)
		<-settlerDone
	}()
	for {
		w.reportDrained()
		// Take what is ready without waiting.
	drain:
		for {
			select {
			case ev := <-w.events:
				ev.apply(ctx, w)
			case snap := <-w.leaseIn:
				w.syncLeases(snap)
			default:
				break drain
			}
		}
		if ctx.Err() != nil {
			break
		}
		w.startSettle()
		now := time.Now()
		if now.Before(w.retryStore) {
			// The store failed recently: wait before touching it again.
		} else {
			// The sweep runs on its own schedule, whatever the load, so a
			// late record waits at most about SweepInterval.
			if !w.sweeping && w.shouldSweep(now) {
				w.sweep(ctx)
			}
			if w.inflight < w.r.cfg.InFlight && !w.settleBound() {
				w.refill(ctx)
				if batches := w.build(w.r.cfg.Now()); len(batches) > 0 {
					deadline := time.Now().Add(w.r.cfg.PublishTimeout)
					for _, b := range batches {
						w.launch(killCtx, b, deadline)
					}
					continue
				}
			}
		}
		// Nothing to do now: wait for a result, a wake-up or a timer.
		t := time.NewTimer(w.nextWake(time.Now()))
		select {
		case ev := <-w.events:
			ev.apply(ctx, w)
		case snap := <-w.leaseIn:
			w.syncLeases(snap)
		case <-w.wake: // refill reads what the notification asked for
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	// Shutdown: wait for what is in flight, then settle it.
	w.stopping = true
	for w.inflight > 0 || w.settlerBusy || w.settleN > 0 || w.fetching || w.sweeping {
		w.startSettle()
		select {
		case ev := <-w.events:
			ev.apply(ctx, w) // (reads are dropped: stopping)
		case <-killCtx.Done():
			return
		}
	}
}

// workerEvent is the result of work done beside the worker's loop, applied
// by the loop (the only goroutine touching the worker's state).
type workerEvent interface {
	apply(ctx context.Context, w *worker)
}

func (res publishResult) apply(_ context.Context, w *worker) { w.handle(res) }
func (res settleResult) apply(_ context.Context, w *worker)  { w.settled(res) }

func (res fetchResult) apply(_ context.Context, w *worker) {
	if w.stopping {
		w.fetching = false // shutting down: drop it
		return
	}
	w.fetched(res)
}

func (res sweepResult) apply(ctx context.Context, w *worker) {
	if w.stopping {
		w.sweeping = false
		return
	}
	w.swept(ctx, res)
}

// startSettle hands the queued settlements to the settler if it is idle.
func (w *worker) startSettle() {
	if w.settlerBusy || w.settleN == 0 {
		return
	}
	// Gather up to a batch's worth until the next multiple of
	// SettleInterval (the same instant for every worker, so that the
	// coalescer merges their writes), unless stopping or handing a
	// partition back, which waits for its settlements.
	timed := w.settleN < w.r.cfg.BatchSize && !w.stopping && !w.shedding
	if timed && time.Now().Before(w.settleAt()) {
		return
	}
	batch := make([]Settlement, 0, len(w.settle))
	for _, s := range w.settle {
		if !s.Empty() {
			batch = append(batch, *s)
		}
	}
	clear(w.settle)
	w.settlerN = w.settleN
	w.settleN = 0
	w.settleSince = time.Time{}
	w.settlerBusy = true
	job := settleJob{batch: batch}
	if timed {
		job.gather = gatherAligned // every worker's settles are due now
	}
	w.settleJobs <- job
}

// settleJob is a batch of settlements for the settler; gather is passed
// to the coalescer.
type settleJob struct {
	batch  []Settlement
	gather time.Duration
}

// settleAt is when the queued settlements are due to be written: the
// first multiple of SettleInterval after the oldest came.
func (w *worker) settleAt() time.Time {
	iv := w.r.cfg.SettleInterval
	return w.settleSince.Truncate(iv).Add(iv)
}

// settleBound reports whether the worker's unwritten settlements have
// reached their bound, 2 × BatchSize × InFlight: it then starts no
// publish until settles succeed again, so that a store refusing settles
// (while fetches work) cannot make it publish the whole backlog, which a
// crash would then publish again.
func (w *worker) settleBound() bool {
	return w.settleN+w.settlerN >= 2*w.r.cfg.BatchSize*w.r.cfg.InFlight
}

// settler writes settlement batches until its channel closes, retrying a
// failed write with backoff until it succeeds or killCtx ends (the
// messages then stay in the outbox and are published again later).
func (w *worker) settler(killCtx context.Context) {
	r := w.r
	for job := range w.settleJobs {
		batch := job.batch
		var fenced []Lease
		retry := r.newRetrier()
		for {
			ctx, cancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
			start := time.Now()
			out := r.calls.settle.do(ctx, batch, job.gather)
			cancel()
			if err := out.err; err == nil {
				fenced = out.fenced
				n := 0
				for _, s := range batch {
					n += len(s.Delivered) + len(s.Retry) + len(s.Dead)
				}
				r.emit(Event{Kind: EventSettled, Count: n, Duration: time.Since(start)})
				break
			}
			if killCtx.Err() != nil {
				break
			}
			r.emit(Event{Kind: EventStoreError, Err: out.err})
			d := retry.failed()
			r.log.Warn("settle failed; retrying", "err", out.err, "attempt", retry.failures, "retry_in", d)
			if !sleepCtx(killCtx, d) {
				break
			}
		}
		w.events <- settleResult{batch: batch, fenced: fenced}
	}
}

// nextWake is how long an idle worker may sleep.
func (w *worker) nextWake(now time.Time) time.Duration {
	cfg := w.r.cfg
	d := cfg.PollInterval
	canStart := w.inflight < cfg.InFlight && !w.settleBound()
	if !w.fetching && canStart {
		// The next poll is due then (otherwise a result wakes the worker
		// first, and refill polls after it).
		d = max(0, w.lastPoll.Add(w.r.pollInterval()).Sub(now))
	}
	if w.settleN > 0 && !w.settlerBusy {
		d = min(d, max(0, w.settleAt().Sub(now)))
	}
	if !w.retryStore.IsZero() && w.retryStore.After(now) {
		d = min(d, w.retryStore.Sub(now))
	}
	if len(w.parts) > 0 && w.r.caps.late == lateSweep && !w.sweeping {
		d = min(d, max(0, w.lastSweep.Add(w.r.cfg.SweepInterval).Sub(now)))
	}
	// A retry coming due matters only if build can take it then: not with
	// every publish slot busy (a result wakes the worker), nor with the
	// settlements at their bound (the settler wakes it), nor for a
	// partition being handed back or whose lease is about to run out.
	if canStart {
		for _, ps := range w.parts {
			if ps.shed || !now.Add(cfg.PublishTimeout).Before(ps.validUntil) {
				continue
			}
			if due := ps.q.nextDue(); !due.IsZero() {
				d = min(d, due.Sub(now))
			}
		}
	}
	return max(d, time.Millisecond)
}

// syncLeases brings the worker's partitions in line with the
// coordinator's latest snapshot of their leases.
func (w *worker) syncLeases(snap map[int]heldLease) {
	r := w.r
	for p, e := range w.fenced {
		if h, ok := snap[p]; !ok || h.Epoch != e {
			delete(w.fenced, p) // the snapshot knows it is gone
		} else {
			delete(snap, p) // sent before the coordinator heard of it
		}
	}
	for p, ps := range w.parts {
		if h, ok := snap[p]; !ok || h.Epoch != ps.lease.Epoch {
			delete(w.parts, p)
			delete(w.settle, p) // fenced anyway
		}
	}
	w.shedding = false
	for p, h := range snap {
		ps, ok := w.parts[p]
		if !ok {
			ps = &partState{
				lease:    h.Lease,
				q:        newPartQueue(),
				inflight: map[string]*Record{},
				settling: map[string]int{},
				deadHeld: map[string]*Record{},
				trunc:    map[string]int64{},
				recov:    map[string]bool{},
			}
			ps.q.hold = r.dests.holdRecord
			w.parts[p] = ps
		}
		ps.validUntil, ps.shed = h.validUntil, h.shed
		w.shedding = w.shedding || h.shed
	}
	w.reorder()
	w.recount()
}

// reportDrained tells the relay which of the partitions it is handing back
// have nothing in flight or waiting to be settled any more.
func (w *worker) reportDrained() {
	if !w.shedding {
		return
	}
	for _, p := range w.order {
		if ps := w.parts[p]; ps.shed && ps.drained() {
			w.r.reports.shedDrained(ps.lease)
		}
	}
}

// reorder rebuilds the round-robin order after partitions came or went.
func (w *worker) reorder() {
	w.order = w.order[:0]
	for p := range w.parts {
		w.order = append(w.order, p)
	}
	slices.Sort(w.order)
}

func (w *worker) recount() {
	w.settleN = 0
	for _, s := range w.settle {
		w.settleN += len(s.Delivered) + len(s.Retry) + len(s.Dead)
	}
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

// unsettle counts n settlements of id as written (or dropped).
func (ps *partState) unsettle(id string, n int) {
	if ps.settling[id] -= n; ps.settling[id] <= 0 {
		delete(ps.settling, id)
	}
}

// drained reports whether nothing of the partition is in flight or
// waiting to be settled.
func (ps *partState) drained() bool {
	return len(ps.inflight) == 0 && len(ps.settling) == 0
}

// fencedIn reports whether l is among the fenced leases.
func fencedIn(fenced []Lease, l Lease) bool {
	for _, f := range fenced {
		if f == l {
			return true
		}
	}
	return false
}

// truncate records that the records of key k dropped from memory (a
// failing key keeps its head only) are to be read again from the store.
func (ps *partState) truncate(k string, dropped []*Record) {
	if len(dropped) == 0 {
		return
	}
	after := dropped[0].Seq - 1
	for _, r := range dropped[1:] {
		after = min(after, r.Seq-1) // late records come after higher Seqs
	}
	if cur, ok := ps.trunc[k]; !ok || after < cur {
		ps.trunc[k] = after
	}
}

// held reports whether rec must stay out of memory because its key is
// failing: above the key's truncation point, or any new record of a
// failing key (which then starts a truncation).
func (ps *partState) held(rec *Record) bool {
	k := queueKey(rec)
	if after, ok := ps.trunc[k]; ok {
		return rec.Seq > after
	}
	if ps.q.isFailing(k) {
		ps.trunc[k] = rec.Seq - 1
		return true
	}
	return false
}

// recovered is called when key k's head was delivered or dead-lettered:
// if records of k were dropped while it failed, the next fetch rewinds the
// cursor to read them again (and only then are they let in).
func (ps *partState) recovered(k string) {
	after, ok := ps.trunc[k]
	if !ok {
		return
	}
	ps.recov[k] = true
	if !ps.rewind || after < ps.rewindTo {
		ps.rewindTo = after
	}
	ps.rewind = true
}

// lowestTrunc returns the lowest truncation point of the partition's
// failing keys, if any.
func (ps *partState) lowestTrunc() (int64, bool) {
	if len(ps.trunc) == 0 {
		return 0, false
	}
	lowest := int64(math.MaxInt64)
	for _, after := range ps.trunc {
		lowest = min(lowest, after)
	}
	if ps.rewind {
		lowest = min(lowest, ps.rewindTo)
	}
	return lowest, true
}

func (ps *partState) known(rec *Record) bool {
	return ps.inflight[rec.ID] != nil || ps.settling[rec.ID] > 0 || ps.q.has(rec)
}

// build picks the next batches: for each key its first pending record (or,
// with a KeyPipeliner, a run of its first records; see take), and only when
// no record of that key is in flight and it is due. A key's run stays in
// one batch.
// Partitions whose lease would not outlive a publish are left alone. The
// records (at most BatchSize per free publish slot) are split evenly over
// the free slots, so that keys come back from the broker in small groups
// and go out again at once instead of waiting for one large batch.
func (w *worker) build(now time.Time) [][]*Record {
	cfg := w.r.cfg
	free := cfg.InFlight - w.inflight
	if free <= 0 {
		return nil
	}
	perKey := w.r.caps.keyPipeline
	// With runs of a key taken together, leave room for splitting at key
	// boundaries (see splitRuns); with one record per key, BatchSize each.
	limit := (cfg.BatchSize - perKey + 1) * free
	var recs []*Record
	n := len(w.order)
	mono := time.Now()
	for k := 0; k < n && len(recs) < limit; k++ {
		p := w.order[(w.next+k)%n]
		ps := w.parts[p]
		if ps.shed || len(ps.q.ready) == 0 && len(ps.q.waiting) == 0 || !mono.Add(cfg.PublishTimeout).Before(ps.validUntil) {
			continue
		}
		for _, rec := range ps.q.take(limit-len(recs), perKey, now) {
			ps.inflight[rec.ID] = rec
			recs = append(recs, rec)
		}
		for _, rec := range ps.q.spilled {
			// A key held for its blocked destination keeps only its head.
			ps.truncate(queueKey(rec), []*Record{rec})
		}
		clear(ps.q.spilled)
		ps.q.spilled = ps.q.spilled[:0]
	}
	if n > 0 {
		w.next = (w.next + 1) % n
	}
	if len(recs) == 0 {
		return nil
	}
	parts := min(free, max(1, len(recs)/minSplitBatch))
	parts = max(parts, (len(recs)+cfg.BatchSize-1)/cfg.BatchSize)
	return splitRuns(recs, parts, cfg.BatchSize)
}

// launch publishes batch in its own goroutine; the result comes back on
// w.results. The publish must end by deadline, fixed when the batch was
// built (build took it from leases valid for a publish from then): a
// goroutine that starts late, after the deadline or after the relay was
// killed, does not publish at all, so no publish runs on a lost lease.
func (w *worker) launch(killCtx context.Context, batch []*Record, deadline time.Time) {
	w.inflight++
	msgs := make([]*Message, len(batch))
	for i, rec := range batch {
		msgs[i] = &rec.Message
	}
	go func() {
		ctx, cancel := context.WithDeadline(killCtx, deadline)
		defer cancel()
		start := time.Now()
		var errs []error
		if ctx.Err() != nil {
			errs = FillErrors(len(msgs), errNotAttempted)
		} else {
			errs = w.r.publish(ctx, batch, msgs)
		}
		w.events <- publishResult{recs: batch, errs: errs, took: time.Since(start)}
	}()
}

// errNotAttempted is the result of a publish that never started: the
// records go back to the head of their keys with no attempt counted.
var errNotAttempted = errors.New("outbox: publish not started: its deadline passed or the relay stopped")

// handle applies a publish result to the worker's state and queues the
// settlement.
func (w *worker) handle(res publishResult) {
	w.inflight--
	now := w.r.cfg.Now()
	outcomes := make([]int, len(res.recs))
	last := w.orphans(res, outcomes)
	kept := 0
	for i, rec := range res.recs {
		w.r.observe(rec, res.errs[i], now) // whatever became of the lease
		ps := w.parts[rec.Partition]
		if outcomes[i] < 0 || ps == nil || ps.inflight[rec.ID] != rec {
			// Orphaned (see orphans), or the lease was lost meanwhile and
			// the new owner publishes it.
			outcomes[i] = -1
			continue
		}
		delete(ps.inflight, rec.ID)
		if res.errs[i] == errNotAttempted {
			// Never sent: back to the head of its key, nothing to settle.
			ps.q.pushFront(rec, now)
			outcomes[i] = -1
			continue
		}
		if _, blocked := IsBlocked(res.errs[i]); blocked {
			// The destination, not the message: no attempt spent, nothing
			// to settle. The record waits at the head of its key (alone in
			// memory) for its destination to work again.
			ps.truncate(queueKey(rec), ps.q.fail(rec, now))
			outcomes[i] = -1
			continue
		}
		kept++
		s := w.settle[rec.Partition]
		if s == nil {
			s = &Settlement{Lease: ps.lease}
			w.settle[rec.Partition] = s
		}
		if len(s.Retry) > 0 {
			// A retry queued earlier and not yet written is superseded.
			before := len(s.Retry)
			s.Retry = slices.DeleteFunc(s.Retry, func(f Failure) bool { return f.ID == rec.ID })
			if gone := before - len(s.Retry); gone > 0 {
				w.settleN -= gone
				ps.unsettle(rec.ID, gone)
			}
		}
		outcomes[i] = w.r.outcome(rec, res.errs[i], now, s)
		if w.settleN == 0 {
			w.settleSince = time.Now()
		}
		w.settleN++
		ps.settling[rec.ID]++
		switch outcomes[i] {
		case outcomeRetry:
			// Retry later, holding back its key (and only its key: what is
			// queued behind it leaves memory until it recovers).
			ps.truncate(queueKey(rec), ps.q.fail(rec, now))
		case outcomeDead:
			// The key stays held until the dead-lettering is written.
			ps.deadHeld[rec.ID] = rec
		default:
			if last[i] {
				ps.q.done(rec, now) // the broker has it: the key goes on
				ps.recovered(queueKey(rec))
			}
		}
	}
	if kept < len(res.recs) {
		recs, outs, errs := make([]*Record, 0, kept), make([]int, 0, kept), make([]error, 0, kept)
		for i, o := range outcomes {
			if o >= 0 {
				recs, outs, errs = append(recs, res.recs[i]), append(outs, o), append(errs, res.errs[i])
			}
		}
		res.recs, outcomes, res.errs = recs, outs, errs
	}
	w.r.report(res.recs, outcomes, res.errs, res.took, now)
}

// orphans applies the rule that keeps a key's order when several of its
// records went in one publish (a run; see take): after the first record of
// a run that was not delivered, the records behind it are not settled,
// whatever the publisher said of them. They go back, unsettled and with no
// attempt counted, to the front of their key's queue (outcome -1), so that
// handle then puts the failed record back in front of them (pushFront),
// drops them with it (fail: read again from the store when the key
// recovers) or keeps them behind its dead-lettering until that is written
// (deadHeld). A later record is thus never acknowledged after an earlier
// one of its key failed; if the broker had it anyway, it is published
// again after the earlier one (a duplicate, not a reorder). It returns,
// per record, whether it ends a run that was delivered whole: only then
// does the key go on (done), once.
func (w *worker) orphans(res publishResult, outcomes []int) (last []bool) {
	last = make([]bool, len(res.recs))
	for i := 0; i < len(res.recs); {
		j := i + 1
		for j < len(res.recs) && sameRun(res.recs[j-1], res.recs[j]) {
			j++
		}
		f := j // the first record of the run [i, j) not delivered
		for k := i; k < j; k++ {
			if err := res.errs[k]; err != nil && !errors.Is(err, ErrDuplicate) {
				f = k
				break
			}
		}
		if f == j {
			last[j-1] = true
		} else if f+1 < j {
			if ps := w.parts[res.recs[f].Partition]; ps != nil {
				var back []*Record
				for k := f + 1; k < j; k++ {
					rec := res.recs[k]
					outcomes[k] = -1
					if ps.inflight[rec.ID] == rec {
						delete(ps.inflight, rec.ID)
						back = append(back, rec)
					}
				}
				if len(back) > 0 && ps.inflight[res.recs[f].ID] == res.recs[f] {
					ps.q.unshift(back)
				}
			}
		}
		i = j
	}
	return last
}

// settled applies what the settler wrote: the records are out of the
// store's outbox (or updated), and fenced partitions are dropped.
func (w *worker) settled(res settleResult) {
	w.settlerBusy = false
	w.settlerN = 0
	now := w.r.cfg.Now()
	for _, s := range res.batch {
		ps := w.parts[s.Partition]
		if ps == nil || ps.lease.Epoch != s.Epoch || fencedIn(res.fenced, s.Lease) {
			continue
		}
		reading := w.fetching || w.sweeping
		for _, id := range s.Delivered {
			ps.unsettle(id, 1)
			if reading {
				w.gone[id] = time.Now()
			}
		}
		for _, f := range s.Retry {
			ps.unsettle(f.ID, 1)
		}
		for _, f := range s.Dead {
			ps.unsettle(f.ID, 1)
			if reading {
				w.gone[f.ID] = time.Now()
			}
			if rec := ps.deadHeld[f.ID]; rec != nil {
				delete(ps.deadHeld, f.ID)
				ps.q.done(rec, now) // written: the key goes on
				ps.recovered(queueKey(rec))
			}
		}
	}
	if len(res.fenced) == 0 {
		return
	}
	w.r.fenced.Add(int64(len(res.fenced)))
	w.r.emit(Event{Kind: EventFenced, Count: len(res.fenced)})
	w.r.log.Warn("partitions lost to another relay", "leases", res.fenced)
	w.r.reports.lost(res.fenced)
	for _, l := range res.fenced {
		w.fenced[l.Partition] = l.Epoch
		if ps := w.parts[l.Partition]; ps != nil && ps.lease.Epoch == l.Epoch {
			delete(w.parts, l.Partition)
			delete(w.settle, l.Partition)
		}
	}
	w.reorder()
	w.recount()
}
