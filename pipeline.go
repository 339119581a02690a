package outbox

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"
)

// The publishing pipeline: what happens to a record between the moment a
// capture side reads it and the moment its settlement is written. It keeps
// a FIFO per key in commit order (partQueue), builds batches of the keys
// whose head may go, bounds the publishes in flight (InFlight) and the
// settlements not yet written (settleBound), publishes, decides each
// record's outcome (delivered, retry with backoff, dead letter, blocked
// destination; see outcome.go) and batches the settlements, which it hands
// back to its capture side to write.
//
// The seam with a capture side:
//
//   - capture → pipeline: feed records in Seq order per partition (feed);
//     ask whether a record is known (known, knownIDs), whether a key is
//     failing (failing) and whether a lane wants more (wants). The owner of
//     the leases (the worker, from the coordinator's snapshots and the
//     fenced leases a settle returns) opens and closes a lane and the
//     capture's state of a partition together (open, close).
//   - pipeline → capture (the source interface): write a batch of
//     settlements and say which leases the store fenced (writeSettlements);
//     the records whose delivery or dead-lettering was written (gone), so
//     that a read in flight cannot queue them again; the records of a
//     failing key that left memory (dropped) and the key's recovery
//     (recovered), after which the capture reads them again, in order.
//
// The poller (capture.go) is the pipeline's capture side in key mode. Who
// owns which partitions is decided outside both: the lease coordinator for
// a Store (coordinator.go), the stream coordinator for a StreamStore, the
// WAL (stream.go), whose relay owns every partition while its process
// holds the stream. A StreamStore's records are read by the poller's
// cursor fetch, never swept; it confirms the slot when settlements are
// written, and copies none of the pipeline. The SKIP LOCKED claim of ordering none (unordered.go) is the
// second capture side: it feeds one claim at a time to a pipeline in
// claims mode (see publishAll): the records have no key order to keep, so
// they wait in one queue instead of per-key FIFOs; each is published once
// per claim, in one call (a record never sent goes in the next); the
// settlements are handed back as soon as the claim is published, to be
// written in the claim's transaction, and the outcomes are counted once
// that committed.
//
// A pipeline belongs to one worker: its state is touched only by the
// worker's goroutine; publishes and settlement writes run beside it and
// come back as events.

// minSplitBatch is the smallest batch the pipeline splits its eligible
// records into when it has several publish slots free.
const minSplitBatch = 16

// source is a capture side as the pipeline sees it: where the records came
// from, and where their settlements go back to.
type source interface {
	// writeSettlements writes one batch of settlements, retrying as its
	// store allows until killCtx ends, and returns the leases the store
	// found fenced, or rolledBack if none of the batch was applied (a
	// claim's transaction). What it could not write stays in the outbox
	// and is published again. The worker's settler goroutine calls it in
	// key mode; publishAll, on the claim's goroutine, in claims mode.
	writeSettlements(killCtx context.Context, batch []Settlement, gather time.Duration) (fenced []Lease, rolledBack bool)
	// gone says that the delivery or dead-lettering of id was written.
	gone(id string)
	// dropped says that recs, records of key k in partition p, left memory
	// because the key is failing or its destination blocked; recovered
	// says that the key goes on: the capture reads them again, in order.
	dropped(p int, k string, recs []*Record)
	recovered(p int, k string)
}

// pipeline is the publishing side of a worker (see above).
type pipeline struct {
	r      *Relay
	src    source
	events chan workerEvent // publish and settle results, to the worker

	// claims: fed one claim at a time by the SKIP LOCKED claim (ordering
	// none), whose records wait in claimQ: see publishAll.
	claims      bool
	claimQ      []*Record
	claimCounts []claimCount
	maxInFlight int // Publish calls in flight at most: InFlight, 1 for claims
	perKey      int // records of a key in one Publish call (caps.keyPipeline; 1 for claims)

	lanes map[int]*lane
	order []int // partitions in round-robin order
	next  int   // round-robin start

	inflight int // Publish calls in flight
	// inflightN counts the records in those calls: each becomes a
	// settlement, so the settlement bound counts them (settleBound).
	inflightN int
	shedding  bool // some lane is being handed back
	stopping  bool // shutting down: nothing new starts, settle at once
	draining  bool // publishing what a stop must settle first: settle at once

	settle  map[int]*Settlement // per partition, waiting to be written
	settleN int
	// The settler goroutine writes one batch of settlements at a time, so
	// the pipeline publishes on while the store deletes.
	settleSince time.Time // when the oldest queued settlement came
	settleJobs  chan settleJob
	settlerBusy bool
	settlerN    int // settlements in the batch the settler is writing
}

// lane is what the pipeline holds of one leased partition.
type lane struct {
	lease      Lease
	validUntil time.Time          // no publish may start that would end after it
	q          partQueue          // fetched, not in flight, per key in commit (fetch) order
	inflight   map[string]*Record // by ID
	// settling counts, per ID, the settlements queued or being written: a
	// record can have a retry being written and its delivery queued.
	settling map[string]int
	// deadHeld are records dead-lettered in memory whose settlement is not
	// written yet: their keys stay held until it is, so that if it is never
	// written (fenced, shed) no later record of the key goes first.
	deadHeld map[string]*Record
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

// settleJob is a batch of settlements for the settler; gather is passed
// to the coalescer.
type settleJob struct {
	batch  []Settlement
	gather time.Duration
}

func newPipeline(r *Relay, src source, events chan workerEvent) *pipeline {
	return &pipeline{
		r:           r,
		src:         src,
		events:      events,
		maxInFlight: r.cfg.InFlight,
		perKey:      max(1, r.caps.keyPipeline),
		lanes:       map[int]*lane{},
		settle:      map[int]*Settlement{},
		settleJobs:  make(chan settleJob),
	}
}

// newClaimsPipeline returns a pipeline in claims mode (see publishAll).
func newClaimsPipeline(r *Relay, src source) *pipeline {
	p := newPipeline(r, src, make(chan workerEvent, 1))
	p.claims, p.maxInFlight, p.perKey = true, 1, 1
	p.settleJobs = nil // publishAll writes the claim's settlements itself
	return p
}

func newLane(l Lease, keyOf func(*Record) string) *lane {
	return &lane{
		lease:    l,
		q:        newPartQueue(keyOf),
		inflight: map[string]*Record{},
		settling: map[string]int{},
		deadHeld: map[string]*Record{},
	}
}

// open makes sure the pipeline has a lane for h (a new one if the epoch
// changed) and updates its validity and hand-back state.
func (p *pipeline) open(h heldLease) {
	ln, ok := p.lanes[h.Partition]
	if !ok || ln.lease.Epoch != h.Epoch {
		p.close(h.Partition)
		ln = newLane(h.Lease, p.r.queueKey)
		ln.q.hold = p.r.dests.holdRecord
		p.lanes[h.Partition] = ln
	}
	ln.validUntil, ln.shed = h.validUntil, h.shed
}

// close drops partition part's lane and its unwritten settlements (the
// lease is gone: they would be fenced anyway).
func (p *pipeline) close(part int) {
	delete(p.lanes, part)
	if s := p.settle[part]; s != nil {
		p.settleN -= len(s.Delivered) + len(s.Retry) + len(s.Dead)
		delete(p.settle, part)
	}
}

// reorder rebuilds the round-robin order and the hand-back flag after
// lanes came, went or changed.
func (p *pipeline) reorder() {
	p.order = slices.Sorted(maps.Keys(p.lanes))
	p.shedding = false
	for _, ln := range p.lanes {
		p.shedding = p.shedding || ln.shed
	}
}

// feed queues rec, read by the capture side, behind the records of its key
// (in claims mode, behind the claim's records).
func (p *pipeline) feed(rec *Record, now time.Time) {
	if p.claims {
		p.claimQ = append(p.claimQ, rec)
		return
	}
	if ln := p.lanes[rec.Partition]; ln != nil {
		ln.q.push(rec, now)
	}
}

// known reports whether the pipeline holds rec: queued, in flight or being
// settled.
func (p *pipeline) known(rec *Record) bool {
	ln := p.lanes[rec.Partition]
	return ln != nil && (ln.inflight[rec.ID] != nil || ln.settling[rec.ID] > 0 || ln.q.has(rec))
}

// knownIDs returns a check of whether the pipeline holds a record of that
// partition and ID, for references that carry no key (built once: the
// queued IDs are collected in one pass).
func (p *pipeline) knownIDs() func(part int, id string) bool {
	queued := map[string]bool{}
	for _, ln := range p.lanes {
		ln.q.each(func(rec *Record) { queued[rec.ID] = true })
	}
	return func(part int, id string) bool {
		ln := p.lanes[part]
		return ln != nil && (queued[id] || ln.inflight[id] != nil || ln.settling[id] > 0)
	}
}

// failing reports whether key k of partition part is failing (its head
// waits for a retry or its destination): its later records stay out of
// memory.
func (p *pipeline) failing(part int, k string) bool {
	ln := p.lanes[part]
	return ln != nil && ln.q.isFailing(k)
}

// wants reports whether partition part's lane takes more records: it is
// held, not being handed back, and its queue runs low. Records of failing
// keys do not count: they hold back only their own key (one record each).
// The hard bound is reached only with more than FetchSize keys of the
// partition failing at once.
func (p *pipeline) wants(part int) bool {
	ln := p.lanes[part]
	if ln == nil || ln.shed {
		return false
	}
	size := p.r.cfg.FetchSize
	return ln.q.n-ln.q.blocked <= size/2 && ln.q.n < 2*size
}

// handingBack reports whether partition part is being handed back.
func (p *pipeline) handingBack(part int) bool {
	ln := p.lanes[part]
	return ln != nil && ln.shed
}

// drained returns the leases being handed back that have nothing in flight
// or waiting to be settled any more.
func (p *pipeline) drained(fn func(Lease)) {
	if !p.shedding {
		return
	}
	for _, part := range p.order {
		if ln := p.lanes[part]; ln.shed && ln.drained() {
			fn(ln.lease)
		}
	}
}

// busy reports whether anything is in flight, being written or waiting to
// be.
func (p *pipeline) busy() bool {
	return p.inflight > 0 || p.settlerBusy || p.settleN > 0
}

// canStart reports whether a publish may start: a slot is free and the
// unwritten settlements are below their bound.
func (p *pipeline) canStart() bool {
	return p.inflight < p.maxInFlight && !p.settleBound()
}

// nextWake is how long the pipeline may wait before it has something to
// do: write settlements that come due, or publish a retry that comes due.
func (p *pipeline) nextWake(now time.Time, d time.Duration) time.Duration {
	cfg := p.r.cfg
	d = p.settleDue(now, d)
	// A retry coming due matters only if build can take it then: not with
	// every publish slot busy (a result wakes the worker), nor with the
	// settlements at their bound (the settler wakes it), nor for a
	// partition being handed back or whose lease is about to run out.
	if p.canStart() {
		for _, ln := range p.lanes {
			if ln.shed || !now.Add(cfg.PublishTimeout).Before(ln.validUntil) {
				continue
			}
			if due := ln.q.nextDue(); !due.IsZero() {
				d = min(d, due.Sub(now))
			}
		}
	}
	return d
}

// retryDueBefore reports whether a key waits for a retry due before t
// (not for a blocked destination).
func (p *pipeline) retryDueBefore(t time.Time) bool {
	for _, ln := range p.lanes {
		for _, q := range ln.q.waiting {
			if at := q.recs[0].NextAttemptAt; at.Before(t) && !p.r.dests.isBlocked(q.recs[0].Topic) {
				return true
			}
		}
	}
	return false
}

// settleDue is d, or less if queued settlements come due before.
func (p *pipeline) settleDue(now time.Time, d time.Duration) time.Duration {
	if p.settleN > 0 && !p.settlerBusy {
		d = min(d, max(0, p.settleAt().Sub(now)))
	}
	return d
}

// startSettle hands the queued settlements to the settler if it is idle.
func (p *pipeline) startSettle() {
	if p.settlerBusy || p.settleN == 0 {
		return
	}
	// Gather up to a batch's worth until the next multiple of
	// SettleInterval (the same instant for every worker, so that the
	// coalescer merges their writes), unless stopping or handing a
	// partition back, which waits for its settlements.
	timed := p.settleN < p.r.cfg.BatchSize && !p.stopping && !p.draining && !p.shedding
	if timed && time.Now().Before(p.settleAt()) {
		return
	}
	job := settleJob{batch: p.takeSettlements()}
	if timed {
		job.gather = gatherAligned // every worker's settles are due now
	}
	p.settleJobs <- job
}

// takeSettlements hands the queued settlements to the settler (which the
// caller then gives them to).
func (p *pipeline) takeSettlements() []Settlement {
	batch := make([]Settlement, 0, len(p.settle))
	for _, s := range p.settle {
		if !s.Empty() {
			batch = append(batch, *s)
		}
	}
	clear(p.settle)
	p.settlerN = p.settleN
	p.settleN = 0
	p.settleSince = time.Time{}
	p.settlerBusy = true
	return batch
}

// settleAt is when the queued settlements are due to be written: the
// first multiple of SettleInterval after the oldest came.
func (p *pipeline) settleAt() time.Time {
	iv := p.r.cfg.SettleInterval
	return p.settleSince.Truncate(iv).Add(iv)
}

// settleBound reports whether the unwritten settlements have reached their
// bound, 2 × BatchSize × InFlight, counting the records in flight (each
// will be one): the pipeline then starts no publish until settles succeed
// again, so that a store refusing settles (while fetches work) cannot make
// it publish the whole backlog, which a crash would then publish again.
// build takes no more records than the room left (settleRoom), so the
// bound holds with publishes in flight too.
func (p *pipeline) settleBound() bool {
	return p.settleRoom() <= 0
}

// settleRoom is how many more records may be published before the
// unwritten settlements, those in flight included, reach their bound.
func (p *pipeline) settleRoom() int {
	return 2*p.r.cfg.BatchSize*p.r.cfg.InFlight - (p.settleN + p.settlerN + p.inflightN)
}

// startSettler starts the settler goroutine; stop ends it and waits.
func (p *pipeline) startSettler(killCtx context.Context) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.settler(killCtx)
	}()
	return func() {
		close(p.settleJobs)
		<-done
	}
}

// settler hands settlement batches to the capture side to write, one at a
// time, until its channel closes.
func (p *pipeline) settler(killCtx context.Context) {
	for job := range p.settleJobs {
		fenced, _ := p.src.writeSettlements(killCtx, job.batch, job.gather) // (the poller never rolls back)
		p.events <- settleResult{batch: job.batch, fenced: fenced}
	}
}

// publishAll is the pipeline's loop in claims mode: it publishes every
// record fed (one claim), one Publish call at a time, waiting for each
// result, then hands the claim's settlements back to the capture side to
// write (even none: the claim's transaction ends either way) and waits
// for that. A record of a claim is published once: whatever its outcome,
// it leaves the pipeline, and the store gives it out again when it is due.
// It returns false if killCtx ended first: the claim is abandoned.
func (p *pipeline) publishAll(killCtx context.Context) bool {
	for {
		if killCtx.Err() != nil {
			p.abandon()
			return false
		}
		if batches := p.build(p.r.cfg.Now()); len(batches) > 0 {
			deadline := time.Now().Add(p.r.cfg.PublishTimeout)
			for _, b := range batches {
				p.launch(killCtx, b, deadline)
			}
		}
		if p.inflight == 0 {
			break
		}
		p.await()
	}
	// Written here, not by the settler: the claim waits for it anyway.
	batch := p.takeSettlements()
	_, rolledBack := p.src.writeSettlements(killCtx, batch, 0)
	p.settled(settleResult{batch: batch})
	if !rolledBack {
		// Counted once the claim's transaction committed.
		for _, c := range p.claimCounts {
			p.r.report(c.recs, c.outcomes, c.errs, c.took, c.now)
		}
	}
	clear(p.claimCounts)
	p.claimCounts = p.claimCounts[:0]
	return true
}

// claimCount is a publish result of a claim, counted (Stats, events) once
// the claim's settlement is written.
type claimCount struct {
	recs     []*Record
	outcomes []int
	errs     []error
	took     time.Duration
	now      time.Time
}

// await applies the next publish result (claims mode: the only events
// are the claim's publishes).
func (p *pipeline) await() {
	p.handle((<-p.events).(publishResult))
}

// abandon forgets the claim (claims mode, killed; nothing is in flight:
// publishAll waits for every result).
func (p *pipeline) abandon() {
	clear(p.claimQ)
	p.claimQ = nil
	clear(p.claimCounts)
	p.claimCounts = p.claimCounts[:0]
	clear(p.settle)
	p.inflight, p.inflightN, p.settleN = 0, 0, 0
}

// buildClaim takes the claim's waiting records as one batch (claims mode).
// A record whose destination is blocked stays out of it, unsettled (the
// claim's commit leaves it as it is), unless it becomes the destination's
// probe: a claim skips paused destinations (Relay.runUnordered), so this
// happens to the records of a destination blocked since the claim, or
// whose probe is due.
func (p *pipeline) buildClaim(now time.Time) [][]*Record {
	if len(p.claimQ) == 0 || p.inflight >= p.maxInFlight {
		return nil
	}
	if p.r.dests.n.Load() > 0 {
		p.claimQ = slices.DeleteFunc(p.claimQ, func(rec *Record) bool {
			return p.r.dests.hold(rec.Topic, now, true).After(now)
		})
	}
	n := min(len(p.claimQ), p.r.cfg.BatchSize)
	if n == 0 {
		p.claimQ = nil
		return nil
	}
	batch := p.claimQ[:n:n]
	p.claimQ = p.claimQ[n:]
	if len(p.claimQ) == 0 {
		p.claimQ = nil // the whole claim in one call, as usual
	}
	return [][]*Record{batch}
}

// unsettle counts n settlements of id as written (or dropped).
func (ln *lane) unsettle(id string, n int) {
	if ln.settling[id] -= n; ln.settling[id] <= 0 {
		delete(ln.settling, id)
	}
}

// drained reports whether nothing of the lane is in flight or waiting to
// be settled.
func (ln *lane) drained() bool {
	return len(ln.inflight) == 0 && len(ln.settling) == 0
}

// build picks the next batches: for each key its first pending record (or,
// with a KeyPipeliner, a run of its first records; see take), and only when
// no record of that key is in flight and it is due. A key's run stays in
// one batch.
// Partitions whose lease would not outlive a publish are left alone. The
// records (at most BatchSize per free publish slot) are split evenly over
// the free slots, so that keys come back from the broker in small groups
// and go out again at once instead of waiting for one large batch.
func (p *pipeline) build(now time.Time) [][]*Record {
	if p.claims {
		return p.buildClaim(now)
	}
	cfg := p.r.cfg
	free := p.maxInFlight - p.inflight
	if free <= 0 {
		return nil
	}
	perKey := p.perKey
	// With runs of a key taken together, leave room for splitting at key
	// boundaries (see splitRuns); with one record per key, BatchSize each.
	limit := min((cfg.BatchSize-perKey+1)*free, p.settleRoom())
	if limit <= 0 {
		return nil
	}
	var recs []*Record
	n := len(p.order)
	mono := time.Now()
	for k := 0; k < n && len(recs) < limit; k++ {
		part := p.order[(p.next+k)%n]
		ln := p.lanes[part]
		for _, key := range ln.q.unpark(p.r.dests.isBlocked) {
			p.src.recovered(part, key) // its destination works again: read its records again
		}
		if ln.shed || len(ln.q.ready) == 0 && len(ln.q.waiting) == 0 || !mono.Add(cfg.PublishTimeout).Before(ln.validUntil) {
			continue
		}
		for _, rec := range ln.q.take(limit-len(recs), perKey, now) {
			ln.inflight[rec.ID] = rec
			recs = append(recs, rec)
		}
		for _, rec := range ln.q.spilled {
			// A key held for its blocked destination keeps only its head,
			// or nothing when another key of the destination keeps one.
			p.src.dropped(part, p.r.queueKey(rec), []*Record{rec})
		}
		clear(ln.q.spilled)
		ln.q.spilled = ln.q.spilled[:0]
	}
	if n > 0 {
		p.next = (p.next + 1) % n
	}
	if len(recs) == 0 {
		return nil
	}
	parts := min(free, max(1, len(recs)/minSplitBatch))
	parts = max(parts, (len(recs)+cfg.BatchSize-1)/cfg.BatchSize)
	return splitRuns(recs, parts, cfg.BatchSize)
}

// launch publishes batch in a goroutine of the relay's pool; the result
// comes back as an event. The publish must end by deadline, fixed when the
// batch was built (build took it from leases valid for a publish from
// then): a goroutine that starts late, after the deadline or after the
// relay was killed, does not publish at all, so no publish runs on a lost
// lease.
func (p *pipeline) launch(killCtx context.Context, batch []*Record, deadline time.Time) {
	p.inflight++
	p.inflightN += len(batch)
	msgs := make([]*Message, len(batch))
	for i, rec := range batch {
		msgs[i] = &rec.Message
	}
	p.r.pool.run(func() {
		ctx, cancel := context.WithDeadline(killCtx, deadline)
		defer cancel()
		start := time.Now()
		var errs []error
		if ctx.Err() != nil {
			errs = FillErrors(len(msgs), errNotAttempted)
		} else {
			errs = p.r.publish(ctx, batch, msgs)
		}
		p.events <- publishResult{recs: batch, errs: errs, took: time.Since(start)}
	})
}

// errNotAttempted is the result of a publish that never started: the
// records go back to the head of their keys with no attempt counted.
var errNotAttempted = errors.New("outbox: publish not started: its deadline passed or the relay stopped")

// handle applies a publish result to the lanes and queues the settlement.
func (p *pipeline) handle(res publishResult) {
	p.inflight--
	p.inflightN -= len(res.recs)
	if p.claims {
		p.handleClaim(res)
		return
	}
	now := p.r.cfg.Now()
	outcomes := make([]int, len(res.recs))
	last := p.orphans(res, outcomes)
	kept := 0
	for i, rec := range res.recs {
		p.r.observe(rec, res.errs[i], now) // whatever became of the lease
		ln := p.lanes[rec.Partition]
		if outcomes[i] < 0 || ln == nil || ln.inflight[rec.ID] != rec {
			// Orphaned (see orphans), or the lease was lost meanwhile and
			// the new owner publishes it.
			outcomes[i] = -1
			continue
		}
		delete(ln.inflight, rec.ID)
		if res.errs[i] == errNotAttempted {
			// Never sent: back to the head of its key, nothing to settle.
			ln.q.pushFront(rec, now)
			outcomes[i] = -1
			continue
		}
		if _, blocked := IsBlocked(res.errs[i]); blocked {
			// The destination, not the message: no attempt spent, nothing
			// to settle. The record waits at the head of its key (alone in
			// memory) for its destination to work again.
			p.src.dropped(rec.Partition, p.r.queueKey(rec), ln.q.fail(rec, now))
			outcomes[i] = -1
			continue
		}
		kept++
		s := p.settle[rec.Partition]
		if s == nil {
			s = &Settlement{Lease: ln.lease}
			p.settle[rec.Partition] = s
		}
		if len(s.Retry) > 0 {
			// A retry queued earlier and not yet written is superseded.
			before := len(s.Retry)
			s.Retry = slices.DeleteFunc(s.Retry, func(f Failure) bool { return f.ID == rec.ID })
			if gone := before - len(s.Retry); gone > 0 {
				p.settleN -= gone
				ln.unsettle(rec.ID, gone)
			}
		}
		outcomes[i] = p.r.outcome(rec, res.errs[i], now, s)
		if p.settleN == 0 {
			p.settleSince = time.Now()
		}
		p.settleN++
		ln.settling[rec.ID]++
		switch {
		case outcomes[i] == outcomeRetry:
			// Retry later, holding back its key (and only its key: what is
			// queued behind it leaves memory until it recovers).
			p.src.dropped(rec.Partition, p.r.queueKey(rec), ln.q.fail(rec, now))
		case outcomes[i] == outcomeDead:
			// The key stays held until the dead-lettering is written.
			ln.deadHeld[rec.ID] = rec
		case last[i]:
			ln.q.done(rec, now) // the broker has it: the key goes on
			p.src.recovered(rec.Partition, p.r.queueKey(rec))
		}
	}
	recs, outs, errs := settledOnly(res, outcomes, kept)
	p.r.report(recs, outs, errs, res.took, now)
}

// handleClaim applies a publish result in claims mode: a record's outcome
// goes in the claim's settlement and the record leaves the pipeline (the
// store gives it out again when it is due); a blocked one is left as it
// is, with no attempt spent; one never sent waits for the next call.
func (p *pipeline) handleClaim(res publishResult) {
	now := p.r.cfg.Now()
	outcomes := make([]int, len(res.recs))
	s := p.settle[0]
	if s == nil {
		s = &Settlement{}
		p.settle[0] = s
	}
	kept := 0
	for i, rec := range res.recs {
		err := res.errs[i]
		p.r.observe(rec, err, now)
		outcomes[i] = -1
		if err == errNotAttempted {
			p.claimQ = append(p.claimQ, rec)
			continue
		}
		if _, blocked := IsBlocked(err); blocked {
			continue
		}
		outcomes[i] = p.r.outcome(rec, err, now, s)
		p.settleN++
		kept++
	}
	recs, outs, errs := settledOnly(res, outcomes, kept)
	p.claimCounts = append(p.claimCounts, claimCount{recs, outs, errs, res.took, now})
}

// settledOnly returns the records of res that have a settlement (outcome
// ≥ 0; kept of them), with their outcomes and errors.
func settledOnly(res publishResult, outcomes []int, kept int) ([]*Record, []int, []error) {
	if kept == len(res.recs) {
		return res.recs, outcomes, res.errs
	}
	recs, outs, errs := make([]*Record, 0, kept), make([]int, 0, kept), make([]error, 0, kept)
	for i, o := range outcomes {
		if o >= 0 {
			recs, outs, errs = append(recs, res.recs[i]), append(outs, o), append(errs, res.errs[i])
		}
	}
	return recs, outs, errs
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
func (p *pipeline) orphans(res publishResult, outcomes []int) (last []bool) {
	last = make([]bool, len(res.recs))
	if p.perKey == 1 {
		// One record per key in a call: no runs (a claim's records of one
		// key are not a run: they have no order to keep).
		for i := range last {
			last[i] = true
		}
		return last
	}
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
			if ln := p.lanes[res.recs[f].Partition]; ln != nil {
				var back []*Record
				for k := f + 1; k < j; k++ {
					rec := res.recs[k]
					outcomes[k] = -1
					if ln.inflight[rec.ID] == rec {
						delete(ln.inflight, rec.ID)
						back = append(back, rec)
					}
				}
				if len(back) > 0 && ln.inflight[res.recs[f].ID] == res.recs[f] {
					ln.q.unshift(back)
				}
			}
		}
		i = j
	}
	return last
}

// settled applies what the settler wrote: the records are out of the
// store's outbox (or updated). Settlements of fenced leases are not
// applied: the worker closes their lanes (worker.drop).
func (p *pipeline) settled(res settleResult) {
	p.settlerBusy = false
	p.settlerN = 0
	now := p.r.cfg.Now()
	for _, s := range res.batch {
		ln := p.lanes[s.Partition]
		if ln == nil || ln.lease.Epoch != s.Epoch || fencedIn(res.fenced, s.Lease) {
			continue
		}
		for _, id := range s.Delivered {
			ln.unsettle(id, 1)
			p.src.gone(id)
		}
		for _, f := range s.Retry {
			ln.unsettle(f.ID, 1)
		}
		for _, f := range s.Dead {
			ln.unsettle(f.ID, 1)
			p.src.gone(f.ID)
			if rec := ln.deadHeld[f.ID]; rec != nil {
				delete(ln.deadHeld, f.ID)
				ln.q.done(rec, now) // written: the key goes on
				p.src.recovered(s.Partition, p.r.queueKey(rec))
			}
		}
	}
}

// fencedIn reports whether l is among the fenced leases.
func fencedIn(fenced []Lease, l Lease) bool {
	return slices.Contains(fenced, l)
}
