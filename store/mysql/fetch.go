package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxrelay/outbox"
)

// cursorsPerStatement bounds the cursors one Fetch or Unsettled statement
// serves: the per-cursor query repeated in one UNION ALL.
const cursorsPerStatement = 64

// Fetch returns, for each cursor, up to limit unpublished records of its
// partition with Seq > After, in Seq order, including records waiting for
// a retry. It takes no lock; reads are not fenced. Up to 64 cursors are
// read with one statement.
func (s *Store) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if err := s.check("fetch"); err != nil {
		return nil, err
	}
	if len(cursors) == 0 {
		return nil, nil
	}
	if limit < 1 {
		return nil, fmt.Errorf("mysql: fetch: limit must be positive, got %d", limit)
	}
	var recs []outbox.Record
	all := cursors
	for len(cursors) > 0 {
		n := min(len(cursors), cursorsPerStatement)
		args := make([]any, 0, 3*n)
		for _, c := range cursors[:n] {
			args = append(args, c.Partition, c.After, limit)
		}
		query := unionOf(s.q.fetchOne, n)
		cursors = cursors[n:]
		rows, err := s.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, s.wrap("fetch", err)
		}
		for rows.Next() {
			r, err := scanRecord(rows)
			if err != nil {
				rows.Close()
				return nil, s.wrap("fetch", err)
			}
			recs = append(recs, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, s.wrap("fetch", err)
		}
	}
	// A UNION ALL has no order of its own.
	slices.SortStableFunc(recs, func(a, b outbox.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	return s.holdBack(ctx, all, recs)
}

// holdBack drops, per partition, the fetched records at and above the
// lowest seq that an open transaction holds in the range the fetch read:
// AUTO_INCREMENT is drawn at insert and a row becomes visible at commit,
// so a row with a lower seq may still commit, and the relay must not move
// its cursor past it (it would be published after later messages of its
// key). The seqs in flight are read after the fetch with a dirty read (READ
// UNCOMMITTED) of the pending index over the fetched range only: what it
// sees and the fetch did not are rows of open transactions (or rows that
// committed between the two reads, held back needlessly until the next
// fetch). A row whose seq was drawn but which is not yet in the index when
// the dirty read runs (inside one INSERT statement) is not seen: if it
// commits below a cursor, the relay's sweep finds it (see doc.go, "Commit
// order").
func (s *Store) holdBack(ctx context.Context, cursors []outbox.Cursor, recs []outbox.Record) ([]outbox.Record, error) {
	if len(recs) == 0 {
		return recs, nil
	}
	after := make(map[int]int64, len(cursors))
	for _, c := range cursors {
		after[c.Partition] = c.After
	}
	type span struct {
		part       int
		from, to   int64 // (from, to]
		seen       map[int64]bool
		start, end int // recs[start:end]
	}
	var spans []*span
	for i := 0; i < len(recs); {
		j := i
		for j < len(recs) && recs[j].Partition == recs[i].Partition {
			j++
		}
		sp := &span{part: recs[i].Partition, from: after[recs[i].Partition], to: recs[j-1].Seq, seen: make(map[int64]bool, j-i), start: i, end: j}
		for _, r := range recs[i:j] {
			sp.seen[r.Seq] = true
		}
		// A span with no gap has nothing below its top that it did not
		// see... except rows of open transactions, which are exactly the
		// gaps: a span as long as its seq range needs no dirty read.
		if int64(j-i) < sp.to-sp.from {
			spans = append(spans, sp)
		}
		i = j
	}
	if len(spans) == 0 {
		return recs, nil
	}
	lowest := make(map[int]int64)
	for len(spans) > 0 {
		n := min(len(spans), cursorsPerStatement)
		args := make([]any, 0, 3*n)
		byPart := make(map[int]*span, n)
		for _, sp := range spans[:n] {
			args = append(args, sp.part, sp.from, sp.to)
			byPart[sp.part] = sp
		}
		spans = spans[n:]
		err := s.dirtyRead(ctx, unionOf(s.q.dirtyOne, n), args, func(part int, seq int64) {
			if sp := byPart[part]; sp != nil && !sp.seen[seq] {
				if l, ok := lowest[part]; !ok || seq < l {
					lowest[part] = seq
				}
			}
		})
		if err != nil {
			return nil, s.wrap("fetch: read the seqs in flight", err)
		}
	}
	if len(lowest) == 0 {
		return recs, nil
	}
	out := recs[:0]
	for _, r := range recs {
		if l, ok := lowest[r.Partition]; ok && r.Seq >= l {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// dirtyRead runs query at READ UNCOMMITTED and calls fn with each (part,
// seq) row.
func (s *Store) dirtyRead(ctx context.Context, query string, args []any, fn func(part int, seq int64)) error {
	scan := func(rows *sql.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var part int
			var seq int64
			if err := rows.Scan(&part, &seq); err != nil {
				return err
			}
			fn(part, seq)
		}
		return rows.Err()
	}
	if s.dirty != nil {
		rows, err := s.dirty.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		return scan(rows)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadUncommitted, ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if err := scan(rows); err != nil {
		return err
	}
	return tx.Commit()
}

// unionOf repeats query n times in one UNION ALL.
func unionOf(query string, n int) string {
	if n == 1 {
		return query
	}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString(query)
	}
	return b.String()
}

// Unsettled returns the references of the unpublished records of each
// cursor's partition with Seq <= After, in Seq order per partition: the
// records the relay holds, those waiting for a retry, and those whose
// transaction committed after records with a higher Seq were fetched (the
// relay's sweep publishes them). It reads the pending index only, never
// the table.
func (s *Store) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	if err := s.check("unsettled"); err != nil {
		return nil, err
	}
	var refs []outbox.RecordRef
	for len(cursors) > 0 {
		n := min(len(cursors), cursorsPerStatement)
		args := make([]any, 0, 2*n)
		for _, c := range cursors[:n] {
			args = append(args, c.Partition, c.After)
		}
		cursors = cursors[n:]
		rows, err := s.db.QueryContext(ctx, unionOf(s.q.unsetOne, n), args...)
		if err != nil {
			return nil, s.wrap("unsettled", err)
		}
		for rows.Next() {
			var r outbox.RecordRef
			if err := rows.Scan(&r.ID, &r.Partition, &r.Seq); err != nil {
				rows.Close()
				return nil, s.wrap("unsettled", err)
			}
			refs = append(refs, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, s.wrap("unsettled", err)
		}
	}
	slices.SortStableFunc(refs, func(a, b outbox.RecordRef) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	return refs, nil
}

// FetchMarked implements outbox.MarkedFetcher: it is Fetch, whose hold-back
// already keeps the relay's cursor below the rows of open transactions, so
// no mark is needed (it returns an empty one and ignores the cursors'). A
// store that implements MarkedFetcher makes the relay sweep below its
// cursors only every 30 s, as a safety net, instead of every
// Config.SweepInterval: on MySQL that sweep (Unsettled) reads every row the
// relay holds in flight, which cost more than the fetches themselves
// during a drain. The rows the hold-back cannot see (a seq drawn but not
// yet indexed, see "Commit order" in the package documentation) are found
// by that safety-net sweep.
func (s *Store) FetchMarked(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, string, error) {
	recs, err := s.Fetch(ctx, cursors, limit)
	return recs, "", err
}
