package sqlite

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/outboxrelay/outbox"
)

// Fetch returns, for each cursor, up to limit unpublished records of its
// partition with Seq > After, in Seq order, including records waiting for
// a retry. It takes no lock; reads are not fenced. Up to 16 cursors are
// read with one statement (one snapshot).
func (s *Store) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if err := s.check("fetch"); err != nil {
		return nil, err
	}
	if len(cursors) == 0 {
		return nil, nil
	}
	if limit < 1 {
		return nil, fmt.Errorf("sqlite: fetch: limit must be positive, got %d", limit)
	}
	var recs []outbox.Record
	var args []any
	for len(cursors) > 0 {
		g := groupFor(len(cursors))
		query, literal := s.fetchQuery(g, limit)
		stmt, err := s.prepared(ctx, query)
		if err != nil {
			return nil, s.wrap("fetch", err)
		}
		args = args[:0]
		for j := range cursorGroups[g] {
			if j < len(cursors) {
				args = append(args, cursors[j].Partition, cursors[j].After)
			} else {
				args = append(args, -1, 0) // no partition -1: no rows
			}
			if !literal {
				args = append(args, limit)
			}
		}
		cursors = cursors[min(len(cursors), cursorGroups[g]):]
		rows, err := stmt.QueryContext(ctx, args...)
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
	// SQLite returns the parts of a UNION ALL in order, each in its ORDER
	// BY; the contract does not rest on that.
	if !slices.IsSortedFunc(recs, byPartitionSeq) {
		slices.SortStableFunc(recs, byPartitionSeq)
	}
	return recs, nil
}

// maxLiteralLimits bounds the distinct limits for which Fetch keeps
// statements with the limit written as a literal; further limits use the
// statements with a bound LIMIT.
const maxLiteralLimits = 8

// fetchQuery returns the Fetch statement for cursorGroups[g] cursors and
// limit, and whether the limit is written in it (else it is bound after
// each cursor's partition and After).
//
// A bound "LIMIT ?" lets SQLite's plan depend on the value, so binding a
// new one (the padding slots of a group bound 0) made SQLite re-prepare
// the statement: Fetch re-parsed its whole UNION ALL, about 0.5 ms of CPU
// for 16 cursors against 15 µs to run it (see BenchmarkFetchRebind). The
// relay fetches with one limit (FetchSize/2), so few texts are kept.
func (s *Store) fetchQuery(g, limit int) (string, bool) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	texts, ok := s.fetchTexts[limit]
	if !ok {
		if len(s.fetchTexts) >= maxLiteralLimits {
			return s.q.fetchGroups[g], false
		}
		if s.fetchTexts == nil {
			s.fetchTexts = make(map[int]*[len(cursorGroups)]string)
		}
		texts = new([len(cursorGroups)]string)
		one := s.q.fetchHead + " LIMIT " + strconv.Itoa(limit)
		for i, n := range cursorGroups {
			texts[i] = groupOf(one, n)
		}
		s.fetchTexts[limit] = texts
	}
	return texts[g], true
}

// byPartitionSeq orders records within a partition by Seq; partitions stay
// grouped.
func byPartitionSeq(a, b outbox.Record) int {
	return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
}

// Unsettled returns the references of the unpublished records of each
// cursor's partition with Seq <= After, in Seq order per partition. As
// SQLite commits in seq order, a record never commits below a fetched one;
// Unsettled finds only records the relay already holds.
func (s *Store) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	if err := s.check("unsettled"); err != nil {
		return nil, err
	}
	if len(cursors) == 0 {
		return nil, nil
	}
	var refs []outbox.RecordRef
	var args []any
	for len(cursors) > 0 {
		g := groupFor(len(cursors))
		stmt, err := s.prepared(ctx, s.q.unsetGroups[g])
		if err != nil {
			return nil, s.wrap("unsettled", err)
		}
		args = args[:0]
		for j := range cursorGroups[g] {
			if j < len(cursors) {
				args = append(args, cursors[j].Partition, cursors[j].After)
			} else {
				args = append(args, -1, 0)
			}
		}
		cursors = cursors[min(len(cursors), cursorGroups[g]):]
		rows, err := stmt.QueryContext(ctx, args...)
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
	cmpRef := func(a, b outbox.RecordRef) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	}
	if !slices.IsSortedFunc(refs, cmpRef) {
		slices.SortStableFunc(refs, cmpRef)
	}
	return refs, nil
}
