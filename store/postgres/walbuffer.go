package postgres

import (
	"sort"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/outbox"
)

// walBuffer holds the captured messages of a WALStore until they are
// delivered or dead-lettered, and computes the position that may be
// confirmed to PostgreSQL. It is not safe for concurrent use: the WALStore
// guards it with its mutex.
//
// Transactions arrive whole and in commit order (pgoutput, protocol 1).
// Each message gets the next Seq, so Seq order is commit order, and is
// appended to its partition. The confirmed position is the commit end LSN
// of the last transaction such that it and every transaction before it has
// all its messages settled; a keepalive's position is taken only when no
// transaction is open or unsettled (what go-pq-cdc got wrong, its #107).
type walBuffer struct {
	p     int
	seq   int64 // last Seq given; never reset, so Seqs stay unique per process
	parts []walPart
	byID  map[string]*walEntry
	txns  []*walTxn // open or unsettled, in commit order
	open  *walTxn   // between Begin and Commit
	n     int       // messages held
	bytes int       // their payload bytes

	confirmed pglogrepl.LSN // everything up to here is settled
	dups      int64         // messages dropped: their ID was held already
}

type walTxn struct {
	commitLSN  pglogrepl.LSN // where the commit record starts (Begin's FinalLSN)
	endLSN     pglogrepl.LSN // where it ends (Commit's TransactionEndLSN)
	commitTime time.Time
	captured   time.Time // when its Begin was received
	committed  bool      // its Commit message arrived
	pending    int       // messages not settled
	settled    int       // messages settled (the transaction is not confirmed yet)
	lastSeq    int64     // Seq of its last message so far
}

type walEntry struct {
	rec  outbox.Record
	txn  *walTxn
	done bool
}

type walPart struct {
	entries []*walEntry // by Seq; settled ones leave lazily
	done    int         // settled entries still in entries
}

func newWALBuffer(p int, confirmed pglogrepl.LSN) *walBuffer {
	return &walBuffer{p: p, parts: make([]walPart, p), byID: map[string]*walEntry{}, confirmed: confirmed}
}

// reset forgets everything held (the connection was lost: what was not
// confirmed comes again from the slot) and starts from confirmed.
func (b *walBuffer) reset(confirmed pglogrepl.LSN) {
	seq, dups := b.seq, b.dups
	*b = *newWALBuffer(b.p, confirmed)
	b.seq, b.dups = seq, dups
}

func (b *walBuffer) begin(commitLSN pglogrepl.LSN, commitTime time.Time) {
	t := &walTxn{commitLSN: commitLSN, commitTime: commitTime, captured: time.Now()}
	b.open = t
	b.txns = append(b.txns, t)
}

// add appends a message of the open transaction and returns its partition,
// or -1 when it was dropped as a duplicate of a message held.
func (b *walBuffer) add(m outbox.Message, decodeErr string) int {
	if _, dup := b.byID[m.ID]; dup {
		b.dups++
		return -1
	}
	b.seq++
	e := &walEntry{rec: outbox.Record{Message: m, Partition: outbox.PartitionOf(m.Key, b.p), Seq: b.seq, DecodeError: decodeErr}, txn: b.open}
	if e.txn == nil { // a message outside Begin/Commit: not from pgoutput v1
		e.txn = &walTxn{committed: true, captured: time.Now()}
	}
	e.txn.pending++
	e.txn.lastSeq = b.seq
	part := &b.parts[e.rec.Partition]
	part.entries = append(part.entries, e)
	b.byID[m.ID] = e
	b.n++
	b.bytes += len(m.Payload)
	return e.rec.Partition
}

func (b *walBuffer) commit(endLSN pglogrepl.LSN) {
	if b.open != nil {
		b.open.endLSN = endLSN
		b.open.committed = true
		b.open = nil
	}
	b.advance()
}

// keepalive takes the server's position when nothing is open or unsettled:
// every transaction that committed before it has been received and
// settled, so an idle outbox in a busy database still advances its slot.
func (b *walBuffer) keepalive(walEnd pglogrepl.LSN) {
	if len(b.txns) == 0 && walEnd > b.confirmed {
		b.confirmed = walEnd
	}
}

// advance pops the settled transactions at the head and confirms them.
func (b *walBuffer) advance() {
	for len(b.txns) > 0 {
		t := b.txns[0]
		if !t.committed || t.pending > 0 {
			return
		}
		b.txns[0] = nil
		b.txns = b.txns[1:]
		if t.endLSN > b.confirmed {
			b.confirmed = t.endLSN
		}
	}
}

// stopBarrier returns the Seq up to which every message must be settled
// for every settled message to be confirmed: the last message so far of
// the last unconfirmed transaction with a settled message; 0 when none
// has one. complete is false when that transaction's Commit has not been
// received yet (more of its messages may come). ahead counts the settled
// messages the confirmed position does not cover (published again if the
// relay stopped now).
func (b *walBuffer) stopBarrier() (seq int64, complete bool, ahead int) {
	complete = true
	for _, t := range b.txns {
		if t.settled > 0 {
			seq, complete = t.lastSeq, t.committed
			ahead += t.settled
		}
	}
	return seq, complete, ahead
}

// heldSince returns when the oldest transaction with a message not
// settled yet was captured, or zero when there is none.
func (b *walBuffer) heldSince() time.Time {
	for _, t := range b.txns {
		if t.pending > 0 {
			return t.captured
		}
	}
	return time.Time{}
}

// stale returns, in Seq order per partition, up to limit unsettled
// entries of the transactions captured at or before cutoff (the ones to
// park), leaving out those that could not be decoded (the relay
// dead-letters them at once, with their decoding error).
func (b *walBuffer) stale(cutoff time.Time, limit int) []*walEntry {
	var out []*walEntry
	for p := range b.parts {
		for _, e := range b.parts[p].entries {
			if len(out) == limit {
				return out
			}
			if e.txn.captured.After(cutoff) {
				break // the entries of a partition are in capture order
			}
			if !e.done && e.rec.DecodeError == "" {
				out = append(out, e)
			}
		}
	}
	return out
}

// full reports whether the bounds are reached: the reader stops reading.
func (b *walBuffer) full(maxMsgs, maxBytes int) bool {
	return b.n >= maxMsgs || b.n > 0 && b.bytes >= maxBytes
}

// get returns the held entry with that ID in partition p, or nil.
func (b *walBuffer) get(id string, p int) *walEntry {
	e := b.byID[id]
	if e == nil || e.rec.Partition != p {
		return nil
	}
	return e
}

// settle forgets e: delivered or dead-lettered.
func (b *walBuffer) settle(e *walEntry) {
	if e.done {
		return
	}
	e.done = true
	delete(b.byID, e.rec.ID)
	b.n--
	b.bytes -= len(e.rec.Payload)
	e.txn.pending--
	e.txn.settled++
	part := &b.parts[e.rec.Partition]
	part.done++
	// Drop settled entries from the head; compact when they pile up
	// behind a failing key.
	i := 0
	for i < len(part.entries) && part.entries[i].done {
		part.entries[i] = nil
		i++
	}
	part.entries = part.entries[i:]
	part.done -= i
	if part.done > 64 && part.done > len(part.entries)/2 {
		live := make([]*walEntry, 0, len(part.entries)-part.done)
		for _, x := range part.entries {
			if !x.done {
				live = append(live, x)
			}
		}
		part.entries, part.done = live, 0
	}
	b.advance()
}

// from returns the index of the first entry of p with Seq > after.
func (b *walBuffer) from(p int, after int64) int {
	es := b.parts[p].entries
	return sort.Search(len(es), func(i int) bool { return es[i].rec.Seq > after })
}

// fetch appends to out up to limit unsettled records of p with Seq > after.
func (b *walBuffer) fetch(out []outbox.Record, p int, after int64, limit int) []outbox.Record {
	es := b.parts[p].entries
	n := 0
	for _, e := range es[b.from(p, after):] {
		if n == limit {
			break
		}
		if !e.done {
			out = append(out, e.rec)
			n++
		}
	}
	return out
}

// oldestPending returns the commit time of the oldest transaction not
// confirmed yet, or zero.
func (b *walBuffer) oldestPending() time.Time {
	if len(b.txns) == 0 {
		return time.Time{}
	}
	return b.txns[0].commitTime
}
