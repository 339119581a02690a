package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"
)

// Fetch returns, for each cursor, up to limit unpublished records of its
// partition with Seq > After, in Seq order, including records waiting for
// a retry. It reads one snapshot and takes no lock; reads are not fenced.
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
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, s.q.fetch)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, c := range cursors {
			rows, err := stmt.QueryContext(ctx, c.Partition, c.After, limit)
			if err != nil {
				return err
			}
			for rows.Next() {
				r, err := scanRecord(rows)
				if err != nil {
					rows.Close()
					return err
				}
				recs = append(recs, r)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap("fetch", err)
	}
	return recs, nil
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
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, s.q.unsettled)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, c := range cursors {
			rows, err := stmt.QueryContext(ctx, c.Partition, c.After)
			if err != nil {
				return err
			}
			for rows.Next() {
				var r outbox.RecordRef
				if err := rows.Scan(&r.ID, &r.Partition, &r.Seq); err != nil {
					rows.Close()
					return err
				}
				refs = append(refs, r)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap("unsettled", err)
	}
	return refs, nil
}
