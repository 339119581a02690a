package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Settle applies settlements in one transaction. It is fenced: in that
// transaction it reads, LOCK IN SHARE MODE, the leases of the
// settlements' partitions (a takeover's UPDATE of one waits for this
// transaction), applies the settlements whose lease node holds with their
// epoch, and returns a *outbox.FencedError listing the leases of the
// others, which it leaves untouched. Delivered records are deleted, or
// marked published when Options.Retention is set; Retry records get their
// attempt count, next attempt time and error; Dead records move to the
// dead letters. Only records of the settlement's partition are touched.
func (s *Store) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	if err := s.check("settle"); err != nil {
		return err
	}
	var parts []any
	for i := range settlements {
		if !settlements[i].Empty() {
			parts = append(parts, settlements[i].Partition)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	if len(parts) > maxParams {
		return fmt.Errorf("mysql: settle: %d settlements; at most %d per call", len(parts), maxParams)
	}
	var fenced []outbox.Lease
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		fenced = fenced[:0]
		held := make(map[int]int64, len(parts))
		rows, err := tx.QueryContext(ctx, s.q.leasesOf+placeholders(len(parts))+") ORDER BY part LOCK IN SHARE MODE", parts...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var p int
			var owner sql.NullString
			var epoch int64
			if err := rows.Scan(&p, &owner, &epoch); err != nil {
				rows.Close()
				return err
			}
			if owner.Valid && owner.String == node {
				held[p] = epoch
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range settlements {
			st := &settlements[i]
			if st.Empty() {
				continue
			}
			if epoch, ok := held[st.Partition]; !ok || epoch != st.Epoch {
				fenced = append(fenced, st.Lease)
				continue
			}
			part := st.Partition
			if err := s.apply(ctx, tx, st, &part); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.wrap("settle", err)
	}
	if len(fenced) > 0 {
		return &outbox.FencedError{Leases: fenced}
	}
	return nil
}

// apply applies st in tx. With part set, only records of that partition
// are touched (ordered mode); otherwise records of any partition (a
// claim), whose deliveries are grouped by partition.
func (s *Store) apply(ctx context.Context, tx *sql.Tx, st *outbox.Settlement, part *int) error {
	head, byID := s.q.deleteIn, s.q.deleteAnyIn
	if s.opts.Retention > 0 {
		head, byID = s.q.publishIn, s.q.publishAnyIn
	}
	if len(st.Delivered) > 0 {
		if part != nil {
			if err := s.deliver(ctx, tx, head, *part, st.Delivered); err != nil {
				return err
			}
		} else {
			// A claim's deliveries span partitions: without the partition
			// the id index alone serves.
			ids := st.Delivered
			for len(ids) > 0 {
				n := min(len(ids), maxParams)
				args := make([]any, n)
				for i, id := range ids[:n] {
					args[i] = id
				}
				if _, err := tx.ExecContext(ctx, byID+placeholders(n)+")", args...); err != nil {
					return fmt.Errorf("delivered: %w", err)
				}
				ids = ids[n:]
			}
		}
	}
	for _, f := range st.Retry {
		if part != nil && f.Partition != *part {
			continue
		}
		if _, err := tx.ExecContext(ctx, s.q.retry, f.Attempts, nullTime(f.NextAttemptAt), storepolicy.ErrorText(f.Err), f.ID, f.Partition); err != nil {
			return fmt.Errorf("retry: %w", err)
		}
	}
	now := s.opts.Now().UTC()
	for _, f := range st.Dead {
		if part != nil && f.Partition != *part {
			continue
		}
		msg := storepolicy.ErrorText(f.Err)
		if _, err := tx.ExecContext(ctx, s.q.deadIns, f.Attempts, msg, now, f.ID, f.Partition, f.Attempts, msg, now); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.q.deadDel, f.ID, f.Partition); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
	}
	return nil
}

func (s *Store) deliver(ctx context.Context, tx *sql.Tx, head string, part int, ids []string) error {
	for len(ids) > 0 {
		n := min(len(ids), maxParams-1)
		args := make([]any, 0, n+1)
		args = append(args, part)
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		if _, err := tx.ExecContext(ctx, head+placeholders(n)+")", args...); err != nil {
			return fmt.Errorf("delivered: %w", err)
		}
		ids = ids[n:]
	}
	return nil
}

// Cleanup deletes up to limit records that were published more than
// Options.Retention ago (by the server's clock), oldest first, and returns
// how many it deleted. Without retention there are none.
func (s *Store) Cleanup(ctx context.Context, limit int) (int64, error) {
	if err := s.check("cleanup"); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("mysql: cleanup: limit must be positive, got %d", limit)
	}
	res, err := s.db.ExecContext(ctx, s.q.cleanup, micros(s.opts.Retention), limit)
	if err != nil {
		return 0, s.wrap("cleanup", err)
	}
	n, err := res.RowsAffected()
	return n, s.wrap("cleanup", err)
}
