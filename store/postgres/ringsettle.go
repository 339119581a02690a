package postgres

// Settling on the ring layout: each settled item names the child its row
// is in, so that the settle statement touches that child only.
//
// A settlement carries message IDs, and a message ID is unique per child
// (the unique index (id, ring)), not across the ring. Matched on id alone,
// the settle planned every child, and a child whose statistics were stale
// (the keeper truncates and refills them every few seconds) was read with
// a BitmapAnd of its id index and its whole pending index: every pending
// row of the child walked once per settled message (40 ms for 50 messages
// on a child of 15,000 rows). So the store remembers the ring of every
// record it returns (Fetch, FetchMarked, ClaimUnordered read the column)
// and the settle says "m.ring = ANY(rings) AND (m.id, m.ring) = (d.id,
// d.ring)": one child planned, one unique index probe per item.
//
// What it remembers is a hint, bounded: two generations of at most
// ringHintsMax IDs each, the older dropped when the newer is full. An ID
// whose hint is gone (a record held back very long) is looked up first,
// in the same round trip's connection: SELECT id, ring … WHERE id =
// ANY(…), an index probe per child. A row never changes child, so a hint
// cannot be wrong; a child is truncated only when it holds no undelivered
// row, and a record the relay still settles is undelivered.

import (
	"context"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// ringHintsMax bounds each generation of ring hints (so at most twice this
// many IDs are remembered: a few megabytes).
const ringHintsMax = 1 << 16

// ringHints maps the IDs of records returned on the ring layout to their
// ring. Safe for concurrent use.
type ringHints struct {
	mu   sync.Mutex
	cur  map[[16]byte]int16
	prev map[[16]byte]int16
}

func (h *ringHints) put(ids [][16]byte, rings []int16) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, id := range ids {
		if len(h.cur) >= ringHintsMax {
			h.prev, h.cur = h.cur, nil
		}
		if h.cur == nil {
			h.cur = make(map[[16]byte]int16)
		}
		h.cur[id] = rings[i]
	}
}

func (h *ringHints) get(id [16]byte) (int16, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.cur[id]; ok {
		return r, true
	}
	r, ok := h.prev[id]
	return r, ok
}

// forget drops the hints of ids (delivered or dead: they leave the table).
func (h *ringHints) forget(idss ...[][16]byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ids := range idss {
		for _, id := range ids {
			delete(h.cur, id)
			delete(h.prev, id)
		}
	}
}

// size returns how many hints are held (for tests).
func (h *ringHints) size() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.cur) + len(h.prev)
}

// recordQueries returns the record statements for the layout the store
// last saw, and whether it is the ring.
func (s *Store) recordQueries() (recordQueries, bool) {
	if s.ringLayout.Load() {
		return s.q.ring, true
	}
	return recordQueries{fetch: s.q.fetch, marked: s.q.marked, claimNew: s.q.claimNew, claimOld: s.q.claimOld}, false
}

// scanRecords reads records (recordColumns, and with ring the ring
// column, whose values it remembers).
func (s *Store) scanRecords(rows pgx.Rows, ring bool) ([]outbox.Record, error) {
	if !ring {
		return pgx.CollectRows(rows, scanRecord)
	}
	var (
		ids   [][16]byte
		rings []int16
	)
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.Record, error) {
		var k int16
		r, id, err := scanRecordWith(row, &k)
		if err == nil {
			ids, rings = append(ids, id), append(rings, k)
		}
		return r, err
	})
	if err != nil {
		return nil, err
	}
	s.hints.put(ids, rings)
	return recs, nil
}

// ringQuerier is what fillRings looks IDs up with: the pool, or a claim's
// transaction.
type ringQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// fillRings gives every item of b its ring on the ring layout (b.rings):
// from the hints, else looked up. Items whose ID no child holds are
// dropped (they settle nothing); an ID held by several children (IDs are
// unique per child only) gets an item per child, as the statement by id
// alone settled them all. On the plain layout it does nothing.
func (s *Store) fillRings(ctx context.Context, q ringQuerier, b *settleBatch) error {
	if !s.ringLayout.Load() {
		return nil
	}
	var missing [][16]byte
	hint := func(ids [][16]byte) []int16 {
		rings := make([]int16, len(ids))
		for i, id := range ids {
			r, ok := s.hints.get(id)
			if !ok {
				r = ringUnknown
				missing = append(missing, id)
			}
			rings[i] = r
		}
		return rings
	}
	b.delRing, b.retryRing, b.deadRing = hint(b.delIDs), hint(b.retryIDs), hint(b.deadIDs)
	b.rings, b.child = true, s.ringChildOf
	if len(missing) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, `SELECT id, ring FROM `+s.n.messages+` WHERE id = ANY($1::uuid[])`, s.planArgs(missing)...)
	if err != nil {
		return err
	}
	found := map[[16]byte][]int16{}
	var (
		id [16]byte
		k  int16
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &k}, func() error {
		found[id] = append(found[id], k)
		return nil
	})
	if err != nil {
		return err
	}
	b.expandRings(found)
	return nil
}

// ringUnknown marks an item whose ring is not known yet.
const ringUnknown = -32768

// expandRings replaces each item whose ring is unknown by one item per
// ring found holds for its ID (none when it holds none).
func (b *settleBatch) expandRings(found map[[16]byte][]int16) {
	keep := func(n int, ring []int16, id func(int) [16]byte, add func(src int, ring int16)) {
		for i := range n {
			if ring[i] != ringUnknown {
				add(i, ring[i])
				continue
			}
			for _, k := range found[id(i)] {
				add(i, k)
			}
		}
	}
	old := *b
	*b = settleBatch{rings: true, child: old.child}
	keep(len(old.delIDs), old.delRing, func(i int) [16]byte { return old.delIDs[i] }, func(i int, k int16) {
		b.delIdx, b.delIDs, b.delRing = append(b.delIdx, old.delIdx[i]), append(b.delIDs, old.delIDs[i]), append(b.delRing, k)
	})
	keep(len(old.retryIDs), old.retryRing, func(i int) [16]byte { return old.retryIDs[i] }, func(i int, k int16) {
		b.retryIdx, b.retryIDs, b.retryRing = append(b.retryIdx, old.retryIdx[i]), append(b.retryIDs, old.retryIDs[i]), append(b.retryRing, k)
		b.retryAtt, b.retryAt, b.retryErr = append(b.retryAtt, old.retryAtt[i]), append(b.retryAt, old.retryAt[i]), append(b.retryErr, old.retryErr[i])
	})
	keep(len(old.deadIDs), old.deadRing, func(i int) [16]byte { return old.deadIDs[i] }, func(i int, k int16) {
		b.deadIdx, b.deadIDs, b.deadRing = append(b.deadIdx, old.deadIdx[i]), append(b.deadIDs, old.deadIDs[i]), append(b.deadRing, k)
		b.deadAtt, b.deadErr = append(b.deadAtt, old.deadAtt[i]), append(b.deadErr, old.deadErr[i])
	})
}

// settled forgets the hints of the items of b that left the table.
func (s *Store) settled(b *settleBatch) {
	if b.rings {
		s.hints.forget(b.delIDs, b.deadIDs)
	}
}

// ringGroups returns the rings of b's items, each once, in ascending
// order.
func (b *settleBatch) ringGroups() []int16 {
	var rings []int16
	for _, rs := range [][]int16{b.delRing, b.retryRing, b.deadRing} {
		for _, k := range rs {
			if !slices.Contains(rings, k) {
				rings = append(rings, k)
			}
		}
	}
	slices.Sort(rings)
	return rings
}

// ofRing returns the items of b in ring k.
func (b *settleBatch) ofRing(k int16) settleBatch {
	var sub settleBatch
	for i, r := range b.delRing {
		if r == k {
			sub.delIdx, sub.delIDs = append(sub.delIdx, b.delIdx[i]), append(sub.delIDs, b.delIDs[i])
		}
	}
	for i, r := range b.retryRing {
		if r == k {
			sub.retryIdx, sub.retryIDs = append(sub.retryIdx, b.retryIdx[i]), append(sub.retryIDs, b.retryIDs[i])
			sub.retryAtt, sub.retryAt, sub.retryErr = append(sub.retryAtt, b.retryAtt[i]), append(sub.retryAt, b.retryAt[i]), append(sub.retryErr, b.retryErr[i])
		}
	}
	for i, r := range b.deadRing {
		if r == k {
			sub.deadIdx, sub.deadIDs = append(sub.deadIdx, b.deadIdx[i]), append(sub.deadIDs, b.deadIDs[i])
			sub.deadAtt, sub.deadErr = append(sub.deadAtt, b.deadAtt[i]), append(sub.deadErr, b.deadErr[i])
		}
	}
	return sub
}

// ringChildOf returns the quoted, qualified name of the child of ring k.
func (s *Store) ringChildOf(k int16) string { return s.ringChild(int(k)) }
