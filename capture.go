package outbox

// The capture side of a worker: it reads records from the store into the
// partitions' queues, and learns from the settlements what no read may
// queue again. The seam with the publishing side (worker.go: the per-key
// queues, batch building, publishing, outcomes, settlement batching) is
//
//   - capture → publishing: fetched and swept push records (in Seq order
//     per partition, late records after what was read before) into
//     partState.q, and nothing else; the cursor and mark of each partition
//     are the capture's own.
//   - publishing → capture: settled records the worker remembers in gone
//     (while a read is in flight) and partState.settling, so that a read
//     that started before a settlement cannot queue its record again; a
//     failing key truncates its queue (partState.trunc) and the capture
//     re-reads its tail when it recovers (partState.rewind).
//
// Other capture sides feed the same pipeline through the Store interface:
// the unordered SKIP LOCKED claim (unordered.go) hands its records to
// publish and outcome directly, and the WAL capture (store/postgres
// WALStore) serves Fetch from the records it streamed, so that it copies
// none of the pipeline.

import (
	"context"
	"time"
)

// refill fetches records for partitions whose pending queue runs low.
func (w *worker) refill(ctx context.Context) {
	if w.fetching {
		return
	}
	cfg := w.r.cfg
	now := time.Now()
	every := w.r.pollInterval()
	poll := now.Sub(w.lastPoll) >= every
	all := w.r.fetchAll[w.index].Swap(false)
	polled, wanted, notified := poll, false, false
	var cursors []Cursor
	for _, p := range w.order {
		ps := w.parts[p]
		if w.r.dirty[p].Swap(false) || all {
			ps.caughtUp = false // written since the last fetch
			notified = true
		}
		if ps.rewind {
			// A failing key recovered: read its dropped records again.
			ps.cursor = min(ps.cursor, ps.rewindTo)
			ps.rewind, ps.caughtUp = false, false
			for k := range ps.recov {
				if !ps.q.isFailing(k) { // (it may have failed again)
					delete(ps.trunc, k)
				}
			}
			clear(ps.recov)
		}
		// Records of failing keys do not count: they hold back only their
		// own key (one record each). The hard bound is reached only with
		// more than FetchSize keys of the partition failing at once.
		if ps.shed || ps.q.n-ps.q.blocked > cfg.FetchSize/2 || ps.q.n >= 2*cfg.FetchSize {
			continue
		}
		if ps.caughtUp && !poll {
			continue
		}
		wanted = wanted || !ps.caughtUp
		cursors = append(cursors, Cursor{Lease: ps.lease, After: ps.cursor, Mark: ps.mark})
	}
	if poll {
		// Polled, even if every partition was full or shed. Polls fall on
		// multiples of PollInterval, the same for every worker, so that an
		// idle relay's polls are coalesced into one fetch.
		w.lastPoll = now.Truncate(every)
	}
	if len(cursors) == 0 {
		return
	}
	w.fetching = true
	w.fetchStart = now
	limit := max(1, cfg.FetchSize/2)
	// A poll alone (no partition notified or running low) is due at the
	// same instant in every worker: let them make one fetch. So are the
	// fetches of the workers a notification woke together.
	var gather time.Duration
	if polled && !wanted {
		gather = gatherAligned
	} else if notified && w.r.notified.Load() > 1 {
		gather = notifyGather
	}
	// The fetch runs beside the publishing; fetched applies its result.
	go func() {
		fctx, cancel := context.WithTimeout(ctx, cfg.PublishTimeout)
		defer cancel()
		res := fetchResult{cursors: cursors, limit: limit, start: now}
		out := w.r.calls.fetch.do(fctx, fetchCall{cursors: cursors, limit: limit}, gather)
		res.recs, res.mark, res.err = out.recs, out.mark, out.err
		w.events <- res
	}()
}

type fetchResult struct {
	cursors []Cursor
	limit   int
	start   time.Time
	recs    []Record
	mark    string
	err     error
}

// fetched applies a fetch: new records go to the back of their
// partition's queue, in Seq order; records that committed below the
// cursor since the last fetch come after everything fetched before.
func (w *worker) fetched(res fetchResult) {
	w.fetching = false
	if res.err != nil {
		w.storeFailed("fetch", res.err)
		w.pruneGone()
		return
	}
	w.storeOK()
	w.r.emit(Event{Kind: EventFetched, Count: len(res.recs), Duration: time.Since(res.start)})
	epochs := make(map[int]int64, len(res.cursors))
	for _, c := range res.cursors {
		epochs[c.Partition] = c.Epoch
	}
	current := func(p int) *partState {
		ps := w.parts[p]
		if ps == nil || ps.lease.Epoch != epochs[p] {
			return nil // dropped, or taken again since: start afresh
		}
		return ps
	}
	now := w.r.cfg.Now()
	counts := map[int]int{}
	for i := range res.recs {
		rec := &res.recs[i]
		ps := current(rec.Partition)
		if ps == nil {
			continue
		}
		counts[rec.Partition]++ // late records count too: a fetch may return only them, up to the limit
		if rec.Seq > ps.cursor {
			ps.cursor = rec.Seq
			if rec.Seq > ps.high {
				ps.high = rec.Seq
			} else if ps.known(rec) {
				continue // read again after a rewind
			}
		} else if ps.known(rec) {
			continue
		}
		if w.stale(rec) || ps.held(rec) {
			// Settled since this fetch started (a sweep found it first),
			// or its key is failing: read again when it recovers.
			continue
		}
		ps.q.push(rec, now)
	}
	for _, c := range res.cursors {
		if ps := current(c.Partition); ps != nil {
			ps.caughtUp = counts[c.Partition] < res.limit
			ps.mark = res.mark
		}
	}
	w.pruneGone()
}

// shouldSweep reports whether it is time to look below the cursors for
// records that committed late: every SweepInterval (stores that bill per
// request, like DynamoDB, pay for every sweep, so there are no extra ones).
func (w *worker) shouldSweep(now time.Time) bool {
	if len(w.parts) == 0 {
		return false
	}
	// Without marks, every SweepInterval; with marks (which already return
	// late commits) it is a safety net; never when nothing can commit
	// below a cursor.
	every, ok := w.r.caps.sweepEvery(w.r.cfg)
	return ok && now.Sub(w.lastSweep) >= every
}

// sweep finds unpublished records below the cursors that the worker has
// never seen (their transaction committed after later records were
// fetched) and queues them. It runs beside the publishing, like a fetch,
// in two steps: the references of the unsettled records below the cursors,
// then (applied by swept) the records the worker does not know.
func (w *worker) sweep(ctx context.Context) {
	w.lastSweep = time.Now()
	var cursors []Cursor
	for _, p := range w.order {
		ps := w.parts[p]
		if ps.cursor > 0 && !ps.shed {
			cursors = append(cursors, Cursor{Lease: ps.lease, After: ps.cursor})
		}
	}
	if len(cursors) == 0 {
		return
	}
	w.sweeping = true
	start := time.Now()
	w.sweepStart = start
	go func() {
		sctx, cancel := context.WithTimeout(ctx, w.r.cfg.PublishTimeout)
		defer cancel()
		refs, err := w.r.store.Unsettled(sctx, cursors)
		w.events <- sweepResult{start: start, refs: refs, err: err}
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
func (w *worker) swept(ctx context.Context, res sweepResult) {
	w.sweeping = false
	if res.err != nil {
		op := "unsettled"
		if res.late {
			op = "fetch late"
		}
		w.storeFailed(op, res.err)
		w.pruneGone()
		return
	}
	if !res.late {
		queued := map[string]bool{}
		for _, p := range w.order {
			w.parts[p].q.each(func(rec *Record) { queued[rec.ID] = true })
		}
		var late []Cursor
		perPart := map[int]int{}
		capped := false
		for _, ref := range res.refs {
			ps := w.parts[ref.Partition]
			_, gone := w.gone[ref.ID]
			if ps == nil || ref.Seq > ps.cursor || gone || queued[ref.ID] || ps.inflight[ref.ID] != nil || ps.settling[ref.ID] > 0 {
				continue
			}
			if lowest, ok := ps.lowestTrunc(); ok && ref.Seq > lowest {
				// Possibly a failing key's dropped record (a reference has
				// no key): the rewind reads it when the key recovers.
				continue
			}
			if perPart[ref.Partition] >= max(1, w.r.cfg.FetchSize/2) {
				// A big late transaction: read it a fetch's worth at a
				// time (references come in Seq order), the rest at once
				// after, so memory stays bounded by FetchSize.
				capped = true
				continue
			}
			perPart[ref.Partition]++
			late = append(late, Cursor{Lease: ps.lease, After: ref.Seq - 1})
		}
		if capped {
			w.lastSweep = time.Time{} // sweep again as soon as this one is applied
		}
		if len(late) == 0 {
			w.pruneGone()
			return
		}
		w.sweeping = true
		go func() {
			sctx, cancel := context.WithTimeout(ctx, w.r.cfg.PublishTimeout)
			defer cancel()
			recs, err := w.r.store.Fetch(sctx, late, 1)
			w.events <- sweepResult{start: res.start, late: true, recs: recs, err: err}
		}()
		return
	}
	now := w.r.cfg.Now()
	for i := range res.recs {
		rec := &res.recs[i]
		ps := w.parts[rec.Partition]
		if ps == nil || rec.Seq > ps.cursor || w.stale(rec) || ps.known(rec) || ps.held(rec) {
			continue
		}
		w.r.log.Warn("late record found by the sweep", "id", rec.ID, "partition", rec.Partition, "seq", rec.Seq)
		ps.q.push(rec, now)
	}
	w.pruneGone()
}

// stale reports whether rec was delivered or dead-lettered after the read
// that returned it started.
func (w *worker) stale(rec *Record) bool {
	_, ok := w.gone[rec.ID]
	return ok
}

// pruneGone forgets settled IDs that no read in flight can return any more:
// those written before the oldest read in flight started (all of them when
// no read is in flight).
func (w *worker) pruneGone() {
	if len(w.gone) == 0 {
		return
	}
	if !w.fetching && !w.sweeping {
		clear(w.gone)
		return
	}
	oldest := time.Now()
	if w.fetching {
		oldest = w.fetchStart
	}
	if w.sweeping && w.sweepStart.Before(oldest) {
		oldest = w.sweepStart
	}
	for id, t := range w.gone {
		if t.Before(oldest) {
			delete(w.gone, id)
		}
	}
}
