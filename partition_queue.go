package outbox

import (
	"slices"
	"time"
)

// keyQueue holds the fetched, unpublished records of one key in commit
// order. Only while no record of the key is in flight may its head be
// published: alone, or with the records behind it to the same topic (up to
// the publisher's KeyPipeline, in one Publish call) when the broker keeps
// their order (see KeyPipeliner and take).
type keyQueue struct {
	key   string
	recs  []*Record
	state queueState
	// failing: the head failed and waits for (or is in) a retry. A failing
	// key keeps only its head in memory; see fail.
	failing bool
}

type queueState uint8

const (
	queueIdle    queueState = iota // empty, or just emptied
	queueReady                     // head publishable now: in ready
	queueWaiting                   // head waits for NextAttemptAt: in waiting
	queueBusy                      // a record of the key is in flight
)

// partQueue is what a worker holds of one partition's records: a queue per
// key, the keys whose head can go now (in the order they became ready), and
// the keys waiting for a retry time. Taking a batch costs what it takes,
// not what is pending. Not safe for concurrent use: it belongs to a worker.
type partQueue struct {
	keyOf   func(*Record) string // the queue key of a record (queueKeyOf)
	queues  map[string]*keyQueue
	ready   []*keyQueue
	waiting []*keyQueue
	n       int // records queued (not in flight)
	blocked int // of those, records of failing keys
	// hold, when set, says until when a head must wait although it is due
	// (its destination is blocked); zero: it may go. With claim, the head
	// asking may become its destination's probe.
	hold func(rec *Record, now time.Time, claim bool) time.Time
	// spilled collects the records dropped from memory when a key is held
	// (see suspend and park); the worker takes them to re-read them later.
	spilled []*Record
	// kept names, per blocked destination (topic), the one key whose head
	// stays in memory to wait for it (and probe it); parked lists the
	// other keys held for it, whose records all left memory (park) and
	// are read again once the destination works (unpark). A blocked
	// destination thus keeps one record of a partition in memory however
	// many of its keys wait, and the partition is fetched on for the
	// others.
	kept   map[string]string
	parked map[string][]string
	// upTo, when positive, is the last Seq take may hand out: a stopping
	// relay draining a stream to its stop barrier publishes nothing past
	// it (a record settled past the barrier moves it, and the other
	// workers, done already, would leave what it moved to unsettled).
	upTo int64
}

func newPartQueue(keyOf func(*Record) string) partQueue {
	return partQueue{queues: map[string]*keyQueue{}, keyOf: keyOf, kept: map[string]string{}, parked: map[string][]string{}}
}

// queueKeyOf returns the function giving the key a record is queued
// under: its key, with its topic in front under OrderScopeTopic (a key's
// messages to different topics are independent). Records without a key
// have no order, so each gets a queue of its own.
func queueKeyOf(scope OrderScope) func(*Record) string {
	if scope == OrderScopeKey {
		return func(rec *Record) string {
			if rec.Key == "" {
				return "\x00" + rec.ID
			}
			return rec.Key
		}
	}
	return func(rec *Record) string {
		if rec.Key == "" {
			return "\x00" + rec.ID
		}
		return rec.Topic + "\x00" + rec.Key
	}
}

// push appends rec behind the queued records of its key.
func (pq *partQueue) push(rec *Record, now time.Time) {
	k := pq.keyOf(rec)
	q := pq.queues[k]
	if q == nil {
		q = &keyQueue{key: k}
		pq.queues[k] = q
	}
	q.recs = append(q.recs, rec)
	pq.n++
	if q.failing {
		pq.blocked++
	}
	if q.state == queueIdle {
		pq.schedule(q, now)
	}
}

// pushFront puts a failed record back at the head of its key's queue; its
// key is no longer in flight.
func (pq *partQueue) pushFront(rec *Record, now time.Time) {
	k := pq.keyOf(rec)
	q := pq.queues[k]
	if q == nil {
		q = &keyQueue{key: k}
		pq.queues[k] = q
	}
	q.recs = slices.Insert(q.recs, 0, rec)
	pq.n++
	if q.failing {
		pq.blocked++
	}
	q.state = queueIdle
	pq.schedule(q, now)
}

// fail puts a record whose publish failed back at the head of its key's
// queue, waiting for its retry, and marks the key failing. The records
// queued behind it are removed and returned: a failing key holds one record
// in memory whatever its backlog, and the caller re-reads the rest from the
// store when the key recovers.
func (pq *partQueue) fail(rec *Record, now time.Time) (dropped []*Record) {
	k := pq.keyOf(rec)
	q := pq.queues[k]
	if q == nil {
		q = &keyQueue{key: k}
		pq.queues[k] = q
	}
	dropped = q.recs
	pq.n -= len(q.recs)
	if q.failing {
		pq.blocked -= len(q.recs)
	}
	q.recs = []*Record{rec}
	q.failing = true
	pq.n++
	pq.blocked++
	q.state = queueIdle
	pq.schedule(q, now)
	return dropped
}

// isFailing reports whether the key's head failed and has not been
// delivered or dead-lettered since.
func (pq *partQueue) isFailing(key string) bool {
	q := pq.queues[key]
	return q != nil && q.failing
}

// done ends the flight of rec's key after rec was delivered or dead-lettered.
func (pq *partQueue) done(rec *Record, now time.Time) {
	k := pq.keyOf(rec)
	q := pq.queues[k]
	if q == nil {
		return
	}
	q.state = queueIdle
	if q.failing {
		q.failing = false
		pq.blocked -= len(q.recs)
	}
	if len(q.recs) == 0 {
		delete(pq.queues, k)
		return
	}
	pq.schedule(q, now)
}

// schedule files an idle, non-empty queue as ready or waiting.
func (pq *partQueue) schedule(q *keyQueue, now time.Time) {
	if q.recs[0].NextAttemptAt.After(now) {
		q.state = queueWaiting
		pq.waiting = append(pq.waiting, q)
		return
	}
	q.state = queueReady
	pq.ready = append(pq.ready, q)
}

// take removes and returns up to max records of ready keys, marking their
// keys in flight: each key's head, followed (when perKey > 1) by up to
// perKey-1 records queued behind it, next to it in the result, in key
// order. A follower must go to the head's topic (one broker partition),
// be due, and be decodable (a record that cannot be decoded fails without
// being sent, and the records behind it would be sent past it); the run
// ends at the first record that is not. A failing key (holding only its
// head) sends its head alone. Waiting keys whose time has come are readied
// first. A head whose destination is blocked is not taken: its key waits
// (and keeps only its head in memory) until the destination works again.
func (pq *partQueue) take(max, perKey int, now time.Time) []*Record {
	if len(pq.waiting) > 0 {
		kept := pq.waiting[:0]
		for _, q := range pq.waiting {
			if pq.held(q, now, false) {
				if pq.keeps(q) {
					kept = append(kept, q)
				}
				continue
			}
			if q.recs[0].NextAttemptAt.After(now) {
				kept = append(kept, q)
				continue
			}
			q.state = queueReady
			pq.ready = append(pq.ready, q)
		}
		clear(pq.waiting[len(kept):])
		pq.waiting = kept
	}
	var out []*Record
	var past []*keyQueue // ready, but their heads are past upTo
	taken := 0
	for taken < len(pq.ready) && len(out) < max {
		q := pq.ready[taken]
		taken++
		if pq.upTo > 0 && q.recs[0].Seq > pq.upTo {
			past = append(past, q)
			continue
		}
		if pq.held(q, now, true) {
			if pq.keeps(q) {
				pq.suspend(q)
				q.state = queueWaiting
				pq.waiting = append(pq.waiting, q)
			}
			continue
		}
		n := 1
		if !q.failing {
			head := q.recs[0]
			for n < perKey && n < len(q.recs) && len(out)+n < max {
				r := q.recs[n]
				if r.Topic != head.Topic || r.NextAttemptAt.After(now) || r.DecodeError != "" || head.DecodeError != "" || pq.upTo > 0 && r.Seq > pq.upTo {
					break
				}
				n++
			}
		}
		out = append(out, q.recs[:n]...)
		clear(q.recs[:n])
		q.recs = q.recs[n:]
		q.state = queueBusy
		pq.n -= n
		if q.failing {
			pq.blocked -= n
		}
	}
	clear(pq.ready[:taken])
	pq.ready = pq.ready[taken:]
	if len(past) > 0 {
		pq.ready = append(past, pq.ready...)
	}
	return out
}

// unshift puts recs, records of one key taken together and not settled
// (they followed a record of theirs that failed in the same publish), back
// at the front of their key's queue, in order, before the failed record is
// itself put back (pushFront, fail) or settled (done). The key stays in
// flight until then.
func (pq *partQueue) unshift(recs []*Record) {
	q := pq.queues[pq.keyOf(recs[0])]
	if q == nil {
		q = &keyQueue{key: pq.keyOf(recs[0]), state: queueBusy}
		pq.queues[q.key] = q
	}
	q.recs = slices.Insert(q.recs, 0, recs...)
	pq.n += len(recs)
	if q.failing {
		pq.blocked += len(recs)
	}
}

// sameRun reports whether b follows a in a run of one key's records taken
// together (take puts a key's records next to each other, all to the
// head's topic).
func sameRun(a, b *Record) bool {
	return a.Key != "" && a.Key == b.Key && a.Topic == b.Topic && a.Partition == b.Partition
}

// keyPipelineOf is how many records of one key the relay passes in one
// Publish call: the publisher's KeyPipeline, at most a quarter of
// BatchSize (so that batches split at key boundaries stay within
// BatchSize and InFlight; see build), and 1 when the publisher does not
// keep a key's order or when Config.OnPermanent is hold. With hold, a
// message that fails permanently must stop its key with nothing after it
// delivered; with a run in flight, that would rest on the publisher not
// writing the run's later messages (KeyPipeliner's promise), which the
// relay cannot check. One record per key in flight keeps hold's guarantee
// the relay's own, whatever the publisher.
func keyPipelineOf(pub Publisher, cfg Config) int {
	kp, ok := pub.(KeyPipeliner)
	if !ok || cfg.OnPermanent == PermanentHoldKey {
		return 1
	}
	return max(1, min(kp.KeyPipeline(), cfg.BatchSize/4))
}

// splitRuns splits recs (runs of one key next to each other) into at most
// parts batches of about equal size, never splitting a key's run (the
// broker keeps a key's order only within one call) and never exceeding
// batchSize. With runs of at most perKey records and len(recs) at most
// parts × (batchSize-perKey+1) (build takes no more), every batch but the
// last holds at least min(size, batchSize-perKey+1) records, so there are
// at most parts batches.
func splitRuns(recs []*Record, parts, batchSize int) [][]*Record {
	size := (len(recs) + parts - 1) / parts
	out := make([][]*Record, 0, parts)
	start := 0
	for i := 0; i < len(recs); {
		j := i + 1
		for j < len(recs) && sameRun(recs[j-1], recs[j]) {
			j++
		}
		if i > start && (i-start >= size || j-start > batchSize) {
			out = append(out, recs[start:i:i])
			start = i
		}
		i = j
	}
	return append(out, recs[start:len(recs):len(recs)])
}

// held reports whether q's head must wait for its destination.
func (pq *partQueue) held(q *keyQueue, now time.Time, claim bool) bool {
	return pq.hold != nil && pq.hold(q.recs[0], now, claim).After(now)
}

// suspend makes a held key failing, keeping only its head in memory: the
// rest goes to spilled, to be read again when the key goes on.
func (pq *partQueue) suspend(q *keyQueue) {
	if !q.failing {
		q.failing = true
		pq.blocked += len(q.recs)
	}
	if len(q.recs) > 1 {
		pq.spilled = append(pq.spilled, q.recs[1:]...)
		pq.n -= len(q.recs) - 1
		pq.blocked -= len(q.recs) - 1
		q.recs = q.recs[:1:1]
	}
}

// keeps decides what becomes of q, whose head must wait for its blocked
// destination: it stays (true) if it is the destination's kept key in this
// partition, or becomes it when there is none; otherwise it is parked.
func (pq *partQueue) keeps(q *keyQueue) bool {
	topic := q.recs[0].Topic
	if k, ok := pq.kept[topic]; ok && k != q.key {
		if o := pq.queues[k]; o != nil && (len(o.recs) == 0 || o.recs[0].Topic == topic) {
			pq.park(q, topic)
			return false
		}
	}
	pq.kept[topic] = q.key
	return true
}

// park drops q, a key held for a blocked destination that already has a
// key kept here: all its records go to spilled (the worker reads them
// again when it is unparked) and its queue goes; the caller drops it from
// ready or waiting.
func (pq *partQueue) park(q *keyQueue, topic string) {
	pq.spilled = append(pq.spilled, q.recs...)
	pq.n -= len(q.recs)
	if q.failing {
		pq.blocked -= len(q.recs)
	}
	clear(q.recs)
	q.recs = nil
	q.state = queueIdle
	delete(pq.queues, q.key)
	pq.parked[topic] = append(pq.parked[topic], q.key)
}

// unpark returns the keys parked for destinations that work again
// (blocked reports which still do not), forgetting them: the worker reads
// their records again, in order.
func (pq *partQueue) unpark(blocked func(topic string) bool) (keys []string) {
	if len(pq.parked) == 0 && len(pq.kept) == 0 {
		return nil
	}
	for topic, ks := range pq.parked {
		if !blocked(topic) {
			keys = append(keys, ks...)
			delete(pq.parked, topic)
		}
	}
	for topic := range pq.kept {
		if !blocked(topic) {
			delete(pq.kept, topic)
		}
	}
	return keys
}

// nextDue returns the earliest time a waiting key's head may go (its retry
// time, or its blocked destination's next probe), or zero.
func (pq *partQueue) nextDue() time.Time {
	var t time.Time
	now := time.Now()
	for _, q := range pq.waiting {
		at := q.recs[0].NextAttemptAt
		if pq.hold != nil {
			if until := pq.hold(q.recs[0], now, false); until.After(at) {
				at = until
			}
		}
		if t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// has reports whether a record with that ID is queued (a linear search:
// for the rare late record).
func (pq *partQueue) has(rec *Record) bool {
	if q := pq.queues[pq.keyOf(rec)]; q != nil {
		for _, r := range q.recs {
			if r.ID == rec.ID {
				return true
			}
		}
	}
	return false
}

// each calls fn for every queued record.
func (pq *partQueue) each(fn func(*Record)) {
	for _, q := range pq.queues {
		for _, r := range q.recs {
			fn(r)
		}
	}
}
