package mysql

import (
	"cmp"
	"context"
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
	return recs, nil
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
