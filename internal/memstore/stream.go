package memstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// Stream is an in-memory stand-in for an outbox captured from a log (like
// PostgreSQL's WAL capture), for the engine's tests of the stream capture
// side: Seq is commit order (outbox.CommitOrdered), and settlements become
// durable only as a prefix of transactions, each Write one transaction
// (outbox.PrefixConfirmer). When the last relay leaves, the messages
// settled past the confirmed prefix are read again, with their Seq, as the
// next holder of a replication slot reads again what was not confirmed.
// It offers neither a marked fetch nor an unordered claim.
type Stream struct {
	s       *Store
	writeMu sync.Mutex // one Write at a time: Seq order is commit order

	mu    sync.Mutex
	txns  []*streamTxn // not confirmed yet, in commit order
	live  map[string]bool
	again int // messages read again because a relay left past the prefix
}

type streamTxn struct {
	recs    []outbox.Record // as written
	settled map[string]bool
}

// NewStream returns a stream store with p partitions.
func NewStream(p int) *Stream {
	return &Stream{s: New(p, nil), live: map[string]bool{}}
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

// CommitOrdered: Seq is commit order.
func (st *Stream) CommitOrdered() {}

func (st *Stream) Partitions(ctx context.Context) (int, error) { return st.s.Partitions(ctx) }

func (st *Stream) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	st.mu.Lock()
	st.live[node] = true
	st.mu.Unlock()
	return st.s.Heartbeat(ctx, node, ttl)
}

func (st *Stream) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	return st.s.AcquireLeases(ctx, node, held, want, ttl)
}

func (st *Stream) ReleaseLeases(ctx context.Context, node string, leases []outbox.Lease) error {
	return st.s.ReleaseLeases(ctx, node, leases)
}

// Leave removes node; when no relay is left, what was settled past the
// confirmed prefix is read again.
func (st *Stream) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := st.s.Leave(ctx, node, leases); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.live, node)
	if len(st.live) > 0 {
		return nil
	}
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
	return nil
}

func (st *Stream) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	return st.s.Fetch(ctx, cursors, limit)
}

func (st *Stream) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	return st.s.Unsettled(ctx, cursors)
}

// Settle applies the settlements, then confirms the prefix of
// transactions whose every message is settled.
func (st *Stream) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	err := st.s.Settle(ctx, node, settlements)
	st.mu.Lock()
	defer st.mu.Unlock()
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
	return err
}

// StopBarrier implements outbox.PrefixConfirmer: the last Seq of the last
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

// Close implements outbox.Store.
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
	_ outbox.Store             = (*Stream)(nil)
	_ outbox.CommitOrdered     = (*Stream)(nil)
	_ outbox.PrefixConfirmer   = (*Stream)(nil)
	_ outbox.PartitionNotifier = (*Stream)(nil)
)
