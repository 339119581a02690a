package outbox

// The partition-lease poller: the capture side of a worker in key mode. It
// reads the records of the partitions the worker leases from the store (a
// fetch after each cursor when notified or polled; a sweep below the
// cursors for records that committed late) and feeds them to the worker's
// pipeline (pipeline.go, which describes the seam), and it writes the
// settlements the pipeline hands back, fenced by the leases.

import (
	"context"
	"maps"
	"math"
	"slices"
	"time"
)

// markedSweepInterval is the least time between sweeps with a store that
// implements MarkedFetcher, whose fetches already return late commits.
var markedSweepInterval = 30 * time.Second

// poller reads a worker's leased partitions into its pipeline. Its state
// is touched only by the worker's goroutine; reads run beside it and come
// back as events.
type poller struct {
	r      *Relay
	index  int // the worker's
	pipe   *pipeline
	events chan<- workerEvent

	parts map[int]*cursorState
	order []int // partitions, in order
	// quiet: the last refill found every partition caught up, and nothing
	// that can change that (a fetch's result, a rewind, a partition taken
	// or dropped, a drain) happened since: until a notification, a poll or
	// such a change, refill has nothing to look at. At a steady load the
	// loop runs several times per transaction (each publish result, each
	// settle) and only the first after a notification fetches.
	quiet bool

	fetching   bool // a fetch is in flight
	fetchStart time.Time
	// A sweep runs beside the publishing too, in two steps (Unsettled,
	// then Fetch of the late records).
	sweeping   bool
	sweepStart time.Time
	lastSweep  time.Time
	// goneIDs holds the IDs whose delivery or dead-lettering was written while
	// a fetch or sweep was in flight, with when: a read that started before
	// may still return them, and must not queue them again.
	goneIDs map[string]time.Time
	// lastPoll is when the poller last fetched every partition it holds,
	// notified or not: a partition whose notification was lost is found
	// within PollInterval even while other partitions keep being notified.
	lastPoll time.Time
	// failed is called with a store error (the worker backs off), ok after
	// a read succeeded.
	failed func(op string, err error)
	ok     func()
	// drainTo, when positive: the relay is stopping and reads only the
	// records up to this Seq (see worker.drain).
	drainTo int64
}

// cursorState is what the poller knows of one leased partition.
type cursorState struct {
	lease    Lease
	cursor   int64  // highest Seq fetched
	mark     string // the MarkedFetcher mark of the fetch that set cursor
	caughtUp bool   // the last fetch returned everything there was
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
}

func newPoller(r *Relay, index int, events chan<- workerEvent, failed func(op string, err error), ok func()) *poller {
	return &poller{
		r:       r,
		index:   index,
		events:  events,
		parts:   map[int]*cursorState{},
		goneIDs: map[string]time.Time{},
		failed:  failed,
		ok:      ok,
	}
}

// open makes sure the poller reads l's partition, from the start if the
// lease is new (or taken again since).
func (c *poller) open(l Lease) {
	if cs, ok := c.parts[l.Partition]; ok && cs.lease.Epoch == l.Epoch {
		return
	}
	c.parts[l.Partition] = &cursorState{lease: l, trunc: map[string]int64{}, recov: map[string]bool{}}
	c.quiet = false
}

// close stops reading partition p.
func (c *poller) close(p int) {
	delete(c.parts, p)
	c.quiet = false
}

// reorder rebuilds the partition order after partitions came or went.
func (c *poller) reorder() {
	c.order = slices.Sorted(maps.Keys(c.parts))
}

// writeSettlements writes a batch through the relay's coalesced settle
// (fenced by the leases, merged with other workers' batches), retrying a
// failed write with backoff until it succeeds or killCtx ends (the
// messages then stay in the outbox and are published again later).
func (c *poller) writeSettlements(killCtx context.Context, batch []Settlement, gather time.Duration) ([]Lease, bool) {
	r := c.r
	retry := r.newRetrier()
	for {
		ctx, cancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
		start := time.Now()
		out := r.calls.settle.do(ctx, batch, gather)
		cancel()
		if out.err == nil {
			n := 0
			for _, s := range batch {
				n += len(s.Delivered) + len(s.Retry) + len(s.Dead)
			}
			r.emit(Event{Kind: EventSettled, Count: n, Duration: time.Since(start)})
			return out.fenced, false
		}
		if killCtx.Err() != nil {
			return nil, false
		}
		r.emit(Event{Kind: EventStoreError, Err: out.err})
		d := retry.failed()
		r.log.Warn("settle failed; retrying", "err", out.err, "attempt", retry.failures, "retry_in", d)
		if !sleepCtx(killCtx, d) {
			return nil, false
		}
	}
}

// gone remembers id while a read is in flight that may still return it.
func (c *poller) gone(id string) {
	if c.fetching || c.sweeping {
		c.goneIDs[id] = time.Now()
	}
}

// dropped records that the records of key k dropped from memory (a
// failing key keeps its head only) are to be read again from the store.
func (c *poller) dropped(p int, k string, recs []*Record) {
	cs := c.parts[p]
	if cs == nil || len(recs) == 0 {
		return
	}
	after := recs[0].Seq - 1
	for _, r := range recs[1:] {
		after = min(after, r.Seq-1) // late records come after higher Seqs
	}
	if cur, ok := cs.trunc[k]; !ok || after < cur {
		cs.trunc[k] = after
	}
}

// recovered is called when key k's head was delivered or dead-lettered:
// if records of k were dropped while it failed, the next fetch rewinds the
// cursor to read them again (and only then are they let in).
func (c *poller) recovered(p int, k string) {
	cs := c.parts[p]
	if cs == nil {
		return
	}
	after, ok := cs.trunc[k]
	if !ok {
		return
	}
	cs.recov[k] = true
	c.quiet = false
	if !cs.rewind || after < cs.rewindTo {
		cs.rewindTo = after
	}
	cs.rewind = true
}

// held reports whether rec must stay out of memory because its key is
// failing: above the key's truncation point, or any new record of a
// failing key (which then starts a truncation).
func (c *poller) held(cs *cursorState, rec *Record) bool {
	k := c.r.queueKey(rec)
	if after, ok := cs.trunc[k]; ok {
		return rec.Seq > after
	}
	if c.pipe.failing(rec.Partition, k) {
		cs.trunc[k] = rec.Seq - 1
		return true
	}
	return false
}

// lowestTrunc returns the lowest truncation point of the partition's
// failing keys, if any.
func (cs *cursorState) lowestTrunc() (int64, bool) {
	if len(cs.trunc) == 0 {
		return 0, false
	}
	lowest := int64(math.MaxInt64)
	for _, after := range cs.trunc {
		lowest = min(lowest, after)
	}
	if cs.rewind {
		lowest = min(lowest, cs.rewindTo)
	}
	return lowest, true
}

// nextWake is how long the poller may wait (at most d, PollInterval,
// unless the next poll is due later) before a poll or a sweep is due;
// canStart says whether the pipeline could publish what it reads.
func (c *poller) nextWake(now time.Time, d time.Duration, canStart bool) time.Duration {
	if !c.fetching && canStart {
		// The next poll is due then (otherwise a result wakes the worker
		// first, and refill polls after it). While subscribed to
		// notifications that is 4 × PollInterval away.
		d = max(0, c.lastPoll.Add(c.r.pollInterval()).Sub(now))
	}
	if len(c.parts) > 0 && c.r.caps.late == lateSweep && !c.sweeping {
		d = min(d, max(0, c.lastSweep.Add(c.r.cfg.SweepInterval).Sub(now)))
	}
	return d
}

// refill fetches records for partitions whose pending queue runs low.
func (c *poller) refill(ctx context.Context) {
	if c.fetching {
		return
	}
	cfg := c.r.cfg
	now := time.Now()
	every := c.r.pollInterval()
	poll := now.Sub(c.lastPoll) >= every
	all := c.r.fetchAll[c.index].Swap(false)
	dirtied := c.index < len(c.r.dirtied) && c.r.dirtied[c.index].Swap(false)
	if c.quiet && !poll && !all && !dirtied {
		return
	}
	polled, wanted, notified := poll, false, false
	behind := false
	var (
		cursors []Cursor
		states  map[int]*cursorState
	)
	for _, p := range c.order {
		cs := c.parts[p]
		if (dirtied && c.r.dirty[p].Swap(false)) || all {
			cs.caughtUp = false // written since the last fetch
			notified = true
		}
		if cs.rewind {
			// A failing key recovered: read its dropped records again.
			cs.cursor = min(cs.cursor, cs.rewindTo)
			cs.rewind, cs.caughtUp = false, false
			for k := range cs.recov {
				if !c.pipe.failing(p, k) { // (it may have failed again)
					delete(cs.trunc, k)
				}
			}
			clear(cs.recov)
		}
		behind = behind || !cs.caughtUp
		if cs.caughtUp && !poll {
			continue
		}
		if !c.pipe.wants(p) {
			continue
		}
		wanted = wanted || !cs.caughtUp
		cursors = append(cursors, Cursor{Lease: cs.lease, After: cs.cursor, Mark: cs.mark})
		if states == nil {
			states = map[int]*cursorState{}
		}
		states[p] = cs
	}
	c.quiet = !behind
	if poll {
		// Polled, even if every partition was full or shed. Polls fall on
		// multiples of PollInterval, the same for every worker, so that an
		// idle relay's polls are coalesced into one fetch.
		c.lastPoll = now.Truncate(every)
	}
	if len(cursors) == 0 {
		return
	}
	c.fetching = true
	c.fetchStart = now
	limit := max(1, cfg.FetchSize/2)
	// A poll alone (no partition notified or running low) is due at the
	// same instant in every worker: let them make one fetch. So are the
	// fetches of the workers a notification woke together.
	var gather time.Duration
	expect := 0
	if polled && !wanted {
		gather = gatherAligned
	} else if n := int(c.r.notified.Load()); notified && n > 1 {
		gather, expect = notifyGather, n
	}
	// The fetch runs beside the publishing; fetched applies its result,
	// which comes as an event (the channel has room for it: one fetch is
	// in flight).
	fctx, cancel := context.WithTimeout(ctx, cfg.PublishTimeout)
	c.r.calls.fetch.submit(fctx, cancel, fetchCall{cursors: cursors, limit: limit}, gather, expect, func(out fetchOut) {
		c.events <- fetchResult{cursors: cursors, states: states, limit: limit, start: now, recs: out.recs, mark: out.mark, err: out.err}
	})
}

type fetchResult struct {
	cursors []Cursor
	// states are the cursor states the fetch read for, by partition: a
	// partition closed and opened again meanwhile has a new one, even
	// under the same epoch (a stream's partitions handed back while cut
	// off from the broker, then owned again under the same hold).
	states map[int]*cursorState
	limit  int
	start  time.Time
	recs   []Record
	mark   string
	err    error
}

// fetched applies a fetch: new records go to the back of their
// partition's queue, in Seq order; records that committed below the
// cursor since the last fetch come after everything fetched before.
func (c *poller) fetched(res fetchResult) {
	c.fetching = false
	c.quiet = false
	if res.err != nil {
		c.failed("fetch", res.err)
		c.pruneGone()
		return
	}
	c.ok()
	c.r.emit(Event{Kind: EventFetched, Count: len(res.recs), Duration: time.Since(res.start)})
	current := func(p int) *cursorState {
		cs := c.parts[p]
		if cs == nil || cs != res.states[p] {
			// Dropped, or opened again since (a new epoch, or the same
			// one after a hand-back): the new cursor starts afresh. Its
			// records would skip what the old one had read and not
			// published, which no fetch from past them reads again.
			return nil
		}
		return cs
	}
	now := c.r.cfg.Now()
	counts := map[int]int{}
	past := map[int]bool{} // partitions that returned a record past drainTo
	for i := range res.recs {
		rec := &res.recs[i]
		cs := current(rec.Partition)
		if cs == nil {
			continue
		}
		counts[rec.Partition]++ // late records count too: a fetch may return only them, up to the limit
		if c.drainTo > 0 && rec.Seq > c.drainTo {
			// Past what a stop drains: the cursor stays below, so that a
			// barrier that rises (a transaction still being read) reads it.
			past[rec.Partition] = true
			continue
		}
		if rec.Seq > cs.cursor {
			cs.cursor = rec.Seq
			if rec.Seq > cs.high {
				cs.high = rec.Seq
			} else if c.pipe.known(rec) {
				continue // read again after a rewind
			}
		} else if c.pipe.known(rec) {
			continue
		}
		if c.stale(rec) || c.held(cs, rec) {
			// Settled since this fetch started (a sweep found it first),
			// or its key is failing: read again when it recovers.
			continue
		}
		c.pipe.feed(rec, now)
	}
	for _, cur := range res.cursors {
		if cs := current(cur.Partition); cs != nil {
			cs.caughtUp = counts[cur.Partition] < res.limit || c.drainTo > 0 && (cs.cursor >= c.drainTo || past[cur.Partition])
			cs.mark = res.mark
		}
	}
	c.pruneGone()
}

// shouldSweep reports whether it is time to look below the cursors for
// records that committed late: every SweepInterval (stores that bill per
// request, like DynamoDB, pay for every sweep, so there are no extra ones).
func (c *poller) shouldSweep(now time.Time) bool {
	if len(c.parts) == 0 || c.sweeping {
		return false
	}
	// Without marks, every SweepInterval; with marks (which already return
	// late commits) it is a safety net; never when nothing can commit
	// below a cursor.
	every, ok := c.r.caps.sweepEvery(c.r.cfg)
	return ok && now.Sub(c.lastSweep) >= every
}

// sweep finds unpublished records below the cursors that the worker has
// never seen (their transaction committed after later records were
// fetched) and queues them. It runs beside the publishing, like a fetch,
// in two steps: the references of the unsettled records below the cursors,
// then (applied by swept) the records the worker does not know.
func (c *poller) sweep(ctx context.Context) {
	c.lastSweep = time.Now()
	var cursors []Cursor
	for _, p := range c.order {
		cs := c.parts[p]
		if cs.cursor > 0 && !c.pipe.handingBack(p) {
			cursors = append(cursors, Cursor{Lease: cs.lease, After: cs.cursor})
		}
	}
	if len(cursors) == 0 {
		return
	}
	c.sweeping = true
	start := time.Now()
	c.sweepStart = start
	go func() {
		sctx, cancel := context.WithTimeout(ctx, c.r.cfg.PublishTimeout)
		defer cancel()
		refs, err := c.r.caps.leases.Unsettled(sctx, cursors)
		c.events <- sweepResult{start: start, refs: refs, err: err}
	}()
}

// sweepResult is one step of a sweep: the references found below the
// cursors, or (late) the records fetched for those the worker did not know.
type sweepResult struct {
	start time.Time
	late  bool
	refs  []RecordRef
	recs  []Record
	err   error
}

// swept applies a step of a sweep.
func (c *poller) swept(ctx context.Context, res sweepResult) {
	c.sweeping = false
	if res.err != nil {
		op := "unsettled"
		if res.late {
			op = "fetch late"
		}
		c.failed(op, res.err)
		c.pruneGone()
		return
	}
	if !res.late {
		known := c.pipe.knownIDs()
		var late []Cursor
		perPart := map[int]int{}
		capped := false
		for _, ref := range res.refs {
			cs := c.parts[ref.Partition]
			_, gone := c.goneIDs[ref.ID]
			if cs == nil || ref.Seq > cs.cursor || gone || known(ref.Partition, ref.ID) {
				continue
			}
			if lowest, ok := cs.lowestTrunc(); ok && ref.Seq > lowest {
				// Possibly a failing key's dropped record (a reference has
				// no key): the rewind reads it when the key recovers.
				continue
			}
			if perPart[ref.Partition] >= max(1, c.r.cfg.FetchSize/2) {
				// A big late transaction: read it a fetch's worth at a
				// time (references come in Seq order), the rest at once
				// after, so memory stays bounded by FetchSize.
				capped = true
				continue
			}
			perPart[ref.Partition]++
			late = append(late, Cursor{Lease: cs.lease, After: ref.Seq - 1})
		}
		if capped {
			c.lastSweep = time.Time{} // sweep again as soon as this one is applied
		}
		if len(late) == 0 {
			c.pruneGone()
			return
		}
		c.sweeping = true
		go func() {
			sctx, cancel := context.WithTimeout(ctx, c.r.cfg.PublishTimeout)
			defer cancel()
			recs, err := c.r.store.Fetch(sctx, late, 1)
			c.events <- sweepResult{start: res.start, late: true, recs: recs, err: err}
		}()
		return
	}
	now := c.r.cfg.Now()
	for i := range res.recs {
		rec := &res.recs[i]
		cs := c.parts[rec.Partition]
		if cs == nil || rec.Seq > cs.cursor || c.stale(rec) || c.pipe.known(rec) || c.held(cs, rec) {
			continue
		}
		c.r.log.Warn("late record found by the sweep", "id", rec.ID, "partition", rec.Partition, "seq", rec.Seq)
		c.pipe.feed(rec, now)
	}
	c.pruneGone()
}

// stale reports whether rec was delivered or dead-lettered after the read
// that returned it started.
func (c *poller) stale(rec *Record) bool {
	_, ok := c.goneIDs[rec.ID]
	return ok
}

// pruneGone forgets settled IDs that no read in flight can return any more:
// those written before the oldest read in flight started (all of them when
// no read is in flight).
func (c *poller) pruneGone() {
	if len(c.goneIDs) == 0 {
		return
	}
	if !c.fetching && !c.sweeping {
		clear(c.goneIDs)
		return
	}
	oldest := time.Now()
	if c.fetching {
		oldest = c.fetchStart
	}
	if c.sweeping && c.sweepStart.Before(oldest) {
		oldest = c.sweepStart
	}
	for id, t := range c.goneIDs {
		if t.Before(oldest) {
			delete(c.goneIDs, id)
		}
	}
}
