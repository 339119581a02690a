package outbox

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// gatherAligned is how long a timed call (a poll, a settle at its
// interval) waits for the other workers' calls due at the same instant.
const gatherAligned = time.Millisecond

// coalescer merges the calls workers make to one store method into fewer
// calls: a caller finding fewer than max calls in flight leads one,
// taking every call pending, its own included; the others wait for their
// part. So a notification that wakes every worker costs about one fetch,
// not one per worker, and settlements of all workers reach the store in
// one statement while another is being written (group commit). A call
// costs no added wait when the store is idle.
type coalescer[Req, Res any] struct {
	mu      sync.Mutex
	pending []*coalesced[Req, Res]
	running int
	max     int
	// gathering: a leader has not yet taken the pending calls; calls
	// arriving meanwhile join its round instead of leading another.
	gathering bool
	// run makes one store call for reqs and returns one result each.
	run func(ctx context.Context, reqs []Req) []Res
}

type coalesced[Req, Res any] struct {
	req  Req
	res  Res
	done chan struct{} // closed when res is set
	lead chan struct{} // closed when this call is to lead the next round
	led  bool          // lead was closed (under the coalescer's mu)
}

// do makes req, alone or merged with others, and returns its result.
// A leader waits gather for other calls first: callers that know others
// are due at the same instant (timed polls and settles, which fall on
// multiples of an interval in every worker) pass a millisecond, so that
// they make one store call instead of one per worker; 0 waits only for
// the goroutines woken with this one.
func (c *coalescer[Req, Res]) do(ctx context.Context, req Req, gather time.Duration) Res {
	cl := &coalesced[Req, Res]{req: req, done: make(chan struct{}), lead: make(chan struct{})}
	c.mu.Lock()
	c.pending = append(c.pending, cl)
	leading := c.running < c.max && !c.gathering
	if leading {
		c.running++
		cl.led = true      // a leader already: never to be handed the lead
		c.gathering = true // until it takes the pending calls
	}
	c.mu.Unlock()
	if !leading {
		select {
		case <-cl.done:
		case <-cl.lead:
		}
		c.mu.Lock()
		promoted := cl.led
		c.mu.Unlock()
		if !promoted {
			return cl.res
		}
		// Handed the lead (and its slot), maybe done by another round
		// already: run the next round anyway, then hand the slot on.
	}
	if leading && gather > 0 {
		t := time.NewTimer(gather)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	} else {
		// Let the workers woken with this one add their calls first.
		runtime.Gosched()
	}
	c.mu.Lock()
	if leading {
		c.gathering = false
	}
	batch := c.pending
	c.pending = nil
	c.mu.Unlock()
	if len(batch) > 0 {
		reqs := make([]Req, len(batch))
		for i, b := range batch {
			reqs[i] = b.req
		}
		res := c.run(ctx, reqs)
		for i, b := range batch {
			b.res = res[i]
			close(b.done)
		}
	}
	// Hand the lead to a call that came meanwhile, or give the slot back.
	c.mu.Lock()
	handed := false
	for _, p := range c.pending {
		if !p.led {
			p.led, handed = true, true
			close(p.lead)
			break
		}
	}
	if !handed {
		c.running--
	}
	c.mu.Unlock()
	<-cl.done // done by this round or another leader's
	return cl.res
}

// handing merges calls into fewer calls as coalescer does, but its
// callers do not wait: each call's result is handed to its deliver
// function by the goroutine that ran the round. So a notification that
// wakes every worker costs one goroutine and one store call, and each
// worker gets its result as an event, without a goroutine of its own
// woken in between. A caller finding fewer than max rounds running starts
// one (a goroutine), which gathers calls first, then runs rounds while
// calls are pending.
type handing[Req, Res any] struct {
	mu        sync.Mutex
	pending   []handed[Req, Res]
	running   int
	max       int
	gathering bool
	// expect is how many calls the gathering leader waits for at most:
	// full is closed when that many are pending (nil when none is
	// awaited).
	expect int
	full   chan struct{}
	run    func(ctx context.Context, reqs []Req) []Res
	pool   *goPool // leaders run on its goroutines (nil: new ones)
}

type handed[Req, Res any] struct {
	ctx     context.Context
	cancel  context.CancelFunc // called once delivered
	req     Req
	deliver func(Res) // must not block
}

// submit makes req, alone or merged with others, and hands its result to
// deliver, in another goroutine. The round req is part of runs with the
// context of the round's first call; every call's cancel is called once its
// result is delivered. gather is as for coalescer.do; a leader that
// gathers stops waiting once expect calls are pending, its own included
// (the workers a notification woke: no need to wait longer once they all
// came; 0 waits for gather).
func (c *handing[Req, Res]) submit(ctx context.Context, cancel context.CancelFunc, req Req, gather time.Duration, expect int, deliver func(Res)) {
	c.mu.Lock()
	c.pending = append(c.pending, handed[Req, Res]{ctx: ctx, cancel: cancel, req: req, deliver: deliver})
	leading := c.running < c.max && !c.gathering
	var full chan struct{}
	if leading {
		c.running++
		c.gathering = true // until it takes the pending calls
		switch {
		case gather > 0 && expect > 1 && len(c.pending) >= expect:
			gather = 0 // the calls it would wait for are here already
		case gather > 0 && expect > 1:
			full = make(chan struct{})
			c.expect, c.full = expect, full
		}
	} else if c.full != nil && len(c.pending) >= c.expect {
		close(c.full)
		c.full = nil
	}
	c.mu.Unlock()
	if leading {
		c.pool.run(func() { c.lead(ctx, gather, full) })
	}
}

// lead gathers calls for gather (0: only those of the goroutines woken
// with the first) or until full is closed, runs them in one round, and
// runs another round while calls came meanwhile that no other leader
// gathers.
func (c *handing[Req, Res]) lead(ctx context.Context, gather time.Duration, full chan struct{}) {
	for {
		if gather > 0 {
			t := time.NewTimer(gather)
			select {
			case <-t.C:
			case <-full: // (nil: never)
			case <-ctx.Done():
			}
			t.Stop()
		} else {
			runtime.Gosched()
		}
		c.mu.Lock()
		c.gathering = false
		c.full = nil
		batch := c.pending
		c.pending = nil
		c.mu.Unlock()
		if len(batch) > 0 {
			reqs := make([]Req, len(batch))
			for i, b := range batch {
				reqs[i] = b.req
			}
			res := c.run(batch[0].ctx, reqs)
			for i, b := range batch {
				b.deliver(res[i])
				b.cancel()
			}
		}
		c.mu.Lock()
		if len(c.pending) == 0 || c.gathering {
			c.running--
			c.mu.Unlock()
			return
		}
		c.gathering = true
		ctx = c.pending[0].ctx
		c.mu.Unlock()
		gather, full = 0, nil
	}
}

// storeCalls are a relay's coalesced fetches and settles.
type storeCalls struct {
	fetch  handing[fetchCall, fetchOut]
	settle coalescer[[]Settlement, settleOut]
}

type fetchCall struct {
	cursors []Cursor
	limit   int
}

type fetchOut struct {
	recs []Record
	mark string
	err  error
}

type settleOut struct {
	fenced []Lease
	err    error
}

// coalescedCallsMax bounds the store calls of one kind a relay has in
// flight: two keep the database busy while one result travels back.
const coalescedCallsMax = 2

func newStoreCalls(r *Relay) *storeCalls {
	sc := &storeCalls{}
	sc.fetch = handing[fetchCall, fetchOut]{max: coalescedCallsMax, run: r.fetchMerged, pool: r.pool}
	sc.settle = coalescer[[]Settlement, settleOut]{max: coalescedCallsMax, run: r.settleMerged}
	return sc
}

// fetchMerged fetches the cursors of several workers in one call per
// limit (workers use one limit, so one call) and gives each its records.
// The cursors of different calls are of different partitions (a partition
// has one worker, with one fetch in flight).
func (r *Relay) fetchMerged(ctx context.Context, calls []fetchCall) []fetchOut {
	out := make([]fetchOut, len(calls))
	byLimit := map[int][]int{}
	for i, c := range calls {
		byLimit[c.limit] = append(byLimit[c.limit], i)
	}
	for limit, idx := range byLimit {
		owner := map[int]int{} // partition → call
		var cursors []Cursor
		for _, i := range idx {
			for _, cur := range calls[i].cursors {
				owner[cur.Partition] = i
			}
			cursors = append(cursors, calls[i].cursors...)
		}
		var recs []Record
		var mark string
		var err error
		if r.caps.late == lateMarked {
			recs, mark, err = r.caps.marked.FetchMarked(ctx, cursors, limit)
		} else {
			recs, err = r.store.Fetch(ctx, cursors, limit)
		}
		for _, i := range idx {
			out[i].mark, out[i].err = mark, err
		}
		if err != nil {
			continue
		}
		if len(idx) == 1 {
			out[idx[0]].recs = recs // one caller: no copy
			continue
		}
		for _, rec := range recs {
			if i, ok := owner[rec.Partition]; ok {
				out[i].recs = append(out[i].recs, rec)
			}
		}
	}
	return out
}

// settleMerged writes the settlements of several workers in one call and
// gives each the leases of its own that were fenced.
func (r *Relay) settleMerged(ctx context.Context, batches [][]Settlement) []settleOut {
	out := make([]settleOut, len(batches))
	var all []Settlement
	if len(batches) == 1 {
		all = batches[0]
	} else {
		for _, b := range batches {
			all = append(all, b...)
		}
	}
	err := r.store.Settle(ctx, r.cfg.Node, all)
	var fe *FencedError
	if err != nil && !errors.As(err, &fe) {
		for i := range out {
			out[i].err = err
		}
		return out
	}
	if fe == nil {
		return out
	}
	for i, b := range batches {
		for _, s := range b {
			if fencedIn(fe.Leases, s.Lease) {
				out[i].fenced = append(out[i].fenced, s.Lease)
			}
		}
	}
	return out
}
