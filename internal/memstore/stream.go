package memstore

import (
	"context"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox"
)

// Stream is an in-memory stand-in for an outbox captured from a log (like
// PostgreSQL's WAL capture), for the engine's tests of the stream capture
// side (outbox.StreamStore): one relay at a time holds the stream, Seq is
// commit order, and settlements become durable only as a prefix of
// transactions, each Write one transaction. When the holder releases it,
// the messages settled past the confirmed prefix are read again, with
// their Seq, as the next holder of a replication slot reads again what was
// not confirmed; the next relay asking for it holds it, with a new epoch.
// It offers neither a marked fetch nor an unordered claim.
type Stream struct {
	s       *Store
	writeMu sync.Mutex // one Write at a time: Seq order is commit order

	mu      sync.Mutex
	txns    []*streamTxn // not confirmed yet, in commit order
	holder  string       // the relay holding the stream, or ""
	epoch   int64        // of the current hold; every hold has a new one
	waiting []string     // relays asking for the stream, in order
	changed chan struct{}
	again   int // messages read again because a holder let go past the prefix
}

type streamTxn struct {
	recs    []outbox.Record // as written
	settled map[string]bool
}

// NewStream returns a stream store with p partitions.
func NewStream(p int) *Stream {
	return &Stream{s: New(p, nil), changed: make(chan struct{})}
}

// Write commits msgs as one transaction.
func (st *Stream) Write(ctx context.Context, msgs ...outbox.Message) error {
	for i := range msgs {
		if msgs[i].ID == "" {
			msgs[i].ID = outbox.NewID()
		}
	}
	// The transaction is recorded before it is visible, so that a settle
	// cannot come before it.
	st.writeMu.Lock()
	defer st.writeMu.Unlock()
	commit, err := st.s.Begin(msgs...)
	if err != nil {
		return err
	}
	t := &streamTxn{settled: map[string]bool{}}
	for _, m := range msgs {
		rec, _ := st.s.Record(m.ID)
		t.recs = append(t.recs, rec)
	}
	st.mu.Lock()
	st.txns = append(st.txns, t)
	st.mu.Unlock()
	commit()
	return nil
}

// Outstanding returns how many messages are not yet published.
func (st *Stream) Outstanding() int { return st.s.Outstanding() }

// Dead returns the dead letters.
func (st *Stream) Dead() []outbox.DeadLetter { return st.s.Dead() }

// ReadAgain returns how many settled messages were read again because the
// last relay left before the confirmed prefix covered them.
func (st *Stream) ReadAgain() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.again
}

func (st *Stream) Partitions(ctx context.Context) (int, error) { return st.s.Partitions(ctx) }

// Holder returns the relay holding the stream and its epoch.
func (st *Stream) Holder() (string, int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.holder, st.epoch
}

// Hold gives node the stream when nobody holds it (the first relay
// waiting, when several ask).
func (st *Stream) Hold(ctx context.Context, node string) (int64, <-chan struct{}, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !slices.Contains(st.waiting, node) && st.holder != node {
		st.waiting = append(st.waiting, node)
	}
	st.handOverLocked()
	if st.holder == node {
		return st.epoch, st.changed, nil
	}
	return 0, st.changed, nil
}

// handOverLocked gives the stream to the first relay waiting when nobody
// holds it.
func (st *Stream) handOverLocked() {
	if st.holder != "" || len(st.waiting) == 0 {
		return
	}
	st.holder, st.waiting = st.waiting[0], st.waiting[1:]
	st.epoch++
	close(st.changed)
	st.changed = make(chan struct{})
}

// Release lets the stream go when node holds it: what was settled past
// the confirmed prefix is read again by the next holder.
func (st *Stream) Release(ctx context.Context, node string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waiting = slices.DeleteFunc(st.waiting, func(n string) bool { return n == node })
	if st.holder != node {
		return nil
	}
	st.holder = ""
	var again []outbox.Record
	for _, t := range st.txns {
		for _, r := range t.recs {
			if t.settled[r.ID] {
				again = append(again, r)
			}
		}
		clear(t.settled)
	}
	st.again += len(again)
	st.s.restore(again)
	close(st.changed)
	st.changed = make(chan struct{})
	st.handOverLocked()
	return nil
}

func (st *Stream) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	return st.s.Fetch(ctx, cursors, limit)
}

// Settle applies the settlements of node's current hold (the others are
// fenced), then confirms the prefix of transactions whose every message
// is settled.
func (st *Stream) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.s.settleUnfenced(settlements, func(l outbox.Lease) bool {
		return st.holder == node && l.Epoch == st.epoch
	}); err != nil {
		return err
	}
	for _, t := range st.txns {
		for _, r := range t.recs {
			if _, held := st.s.Record(r.ID); !held {
				t.settled[r.ID] = true
			}
		}
	}
	i := 0
	for i < len(st.txns) && len(st.txns[i].settled) == len(st.txns[i].recs) {
		i++
	}
	st.txns = slices.Delete(st.txns, 0, i)
	return nil
}

// StopBarrier implements outbox.StreamStore: the last Seq of the last
// unconfirmed transaction with a settled message (always complete: a
// Write is visible whole).
func (st *Stream) StopBarrier() (int64, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var seq int64
	for _, t := range st.txns {
		if len(t.settled) > 0 {
			seq = t.recs[len(t.recs)-1].Seq
		}
	}
	return seq, true
}

func (st *Stream) SubscribePartitions(ctx context.Context, fn func([]int)) error {
	return st.s.SubscribePartitions(ctx, fn)
}

// Close is a no-op.
func (st *Stream) Close() error { return nil }

// restore makes records outstanding again, with their Seq.
func (s *Store) restore(recs []outbox.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		if _, ok := s.msgs[r.ID]; ok {
			continue
		}
		s.commits++
		s.msgs[r.ID] = &entry{rec: r, visible: true, commitNo: s.commits}
	}
}

var (
	_ outbox.StreamStore       = (*Stream)(nil)
	_ outbox.PartitionNotifier = (*Stream)(nil)
)
