package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// Defaults of dead-letter listing.
const (
	// DeadLetterLimitDefault is how many dead letters DeadLetters lists when
	// the filter's Limit is 0.
	DeadLetterLimitDefault = storepolicy.DeadLetterLimitDefault
	// DeadLetterLimitMax bounds DeadLetterFilter.Limit.
	DeadLetterLimitMax = 100000
)

// deadLetterWhere appends the filter's WHERE clause (alias d) to q.
func deadLetterWhere(q *sqlBuilder, f outbox.DeadLetterFilter) error {
	q.WriteString(" WHERE true")
	if f.Topic != "" {
		q.WriteString(" AND d.topic = " + q.arg(f.Topic))
	}
	if len(f.IDs) > 0 {
		ids := make([][16]byte, len(f.IDs))
		for i, id := range f.IDs {
			u, err := parseUUID(id)
			if err != nil {
				return fmt.Errorf("DeadLetterFilter.IDs[%d]: %w", i, err)
			}
			ids[i] = u
		}
		q.WriteString(" AND d.id = ANY(" + q.arg(ids) + "::uuid[])")
	}
	if !f.FailedBefore.IsZero() {
		q.WriteString(" AND d.failed_at < " + q.arg(f.FailedBefore))
	}
	if f.Key != "" {
		q.WriteString(" AND d.key = " + q.arg(f.Key))
	}
	if f.ErrorContains != "" {
		// strpos, not LIKE: the text is matched literally, wildcards and all.
		q.WriteString(" AND strpos(lower(d.last_error), lower(" + q.arg(f.ErrorContains) + ")) > 0")
	}
	if !f.FailedAfter.IsZero() {
		q.WriteString(" AND d.failed_at >= " + q.arg(f.FailedAfter))
	}
	return nil
}

// DeadLetters lists the dead letters matching f, oldest failure first, at
// most f.Limit (default [DeadLetterLimitDefault]).
func (s *Store) DeadLetters(ctx context.Context, f outbox.DeadLetterFilter) ([]outbox.DeadLetter, error) {
	if err := s.check("dead letters"); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit == 0 {
		limit = DeadLetterLimitDefault
	}
	if limit < 0 || limit > DeadLetterLimitMax {
		return nil, fmt.Errorf("postgres: dead letters: DeadLetterFilter.Limit must be between 1 and %d (0 for %d), got %d", DeadLetterLimitMax, DeadLetterLimitDefault, f.Limit)
	}
	var q sqlBuilder
	q.WriteString(`SELECT d.id, d.topic, d.key, d.payload, d.headers::text, d.created_at, d.attempts, d.last_error, d.failed_at FROM ` + s.n.deadLetters + ` d`)
	if err := deadLetterWhere(&q, f); err != nil {
		return nil, fmt.Errorf("postgres: dead letters: %w", err)
	}
	if f.After != nil {
		u, err := parseUUID(f.After.ID)
		if err != nil {
			return nil, fmt.Errorf("postgres: dead letters: DeadLetterFilter.After.ID: %w", err)
		}
		q.WriteString(" AND (d.failed_at, d.id) > (" + q.arg(f.After.FailedAt) + ", " + q.arg(u) + "::uuid)")
	}
	q.WriteString(" ORDER BY d.failed_at, d.id LIMIT " + q.arg(limit))
	rows, err := s.pool.Query(ctx, q.String(), q.args...)
	if err != nil {
		return nil, s.wrap("dead letters", err)
	}
	dls, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.DeadLetter, error) {
		var (
			d       outbox.DeadLetter
			id      [16]byte
			headers *string
		)
		err := row.Scan(&id, &d.Topic, &d.Key, &d.Payload, &headers, &d.CreatedAt, &d.Attempts, &d.LastError, &d.FailedAt)
		if err != nil {
			return d, err
		}
		d.ID = uuid.Format(id)
		if headers != nil {
			if err := json.Unmarshal([]byte(*headers), &d.Headers); err != nil {
				// A record dead-lettered because its headers could not be
				// decoded: its LastError says so; list it without them.
				d.Headers = nil
			}
		}
		if d.Payload == nil {
			d.Payload = []byte{}
		}
		return d, nil
	})
	if err != nil {
		return nil, s.wrap("dead letters", err)
	}
	return dls, nil
}

// Requeue moves the dead letters matching f (Limit ignored) back into the
// outbox in one statement: each gets a new Seq, after every message already
// there (so after every message of its key), with attempts reset, in the
// order of their original Seq (dead letters from before migration 4, which
// did not keep it, after the others, by CreatedAt). A dead letter whose ID
// is in the outbox again (written anew) stays a dead letter. It returns how
// many moved.
func (s *Store) Requeue(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("requeue"); err != nil {
		return 0, err
	}
	// An outbox captured from the WAL has no table relay: a requeue into
	// the table would park the messages where nothing reads them.
	walSlot, err := s.WALCaptured(ctx)
	if err != nil {
		return 0, s.wrap("requeue", err)
	}
	if slot := s.opts.WAL.Slot; walSlot {
		return 0, fmt.Errorf("postgres: requeue: %w: the replication slot %q of this outbox exists, so its relay reads the WAL, and messages requeued into the table would wait where no relay reads them; requeue with capture wal (`outbox dlq requeue --capture wal …`, or WALStore.Requeue), or, if you went back to table capture, drop the slot (SELECT pg_drop_replication_slot('%s'))", ErrWALCaptured, slot, slot)
	}
	var q sqlBuilder
	q.WriteString(`WITH moved AS (
    DELETE FROM ` + s.n.deadLetters + ` d`)
	if err := deadLetterWhere(&q, f); err != nil {
		return 0, fmt.Errorf("postgres: requeue: %w", err)
	}
	q.WriteString(`
      AND NOT EXISTS (SELECT 1 FROM ` + s.n.messages + ` m WHERE m.id = d.id)
    RETURNING d.id, d.seq, d.partition, d.topic, d.key, d.payload, d.headers, d.created_at
)
INSERT INTO ` + s.n.messages + ` (id, partition, topic, key, payload, headers, created_at)
SELECT id, partition, topic, key, payload, headers, created_at FROM moved ORDER BY seq NULLS LAST, created_at, id`)
	tag, err := s.pool.Exec(ctx, q.String(), q.args...)
	if err != nil {
		return 0, s.wrap("requeue", err)
	}
	return tag.RowsAffected(), nil
}

// WALCaptured reports whether this outbox is captured from the WAL: the
// replication slot that capture wal would read (Options.WAL.Slot, by
// default named after the schema and prefix) exists in this database.
func (s *Store) WALCaptured(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database())`, s.opts.WAL.Slot).Scan(&ok)
	return ok, err
}

// PurgeDeadLetters deletes the dead letters matching f (Limit ignored) for
// good and returns how many it deleted.
func (s *Store) PurgeDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("purge dead letters"); err != nil {
		return 0, err
	}
	var q sqlBuilder
	q.WriteString(`DELETE FROM ` + s.n.deadLetters + ` d`)
	if err := deadLetterWhere(&q, f); err != nil {
		return 0, fmt.Errorf("postgres: purge dead letters: %w", err)
	}
	tag, err := s.pool.Exec(ctx, q.String(), q.args...)
	if err != nil {
		return 0, s.wrap("purge dead letters", err)
	}
	return tag.RowsAffected(), nil
}

// Cleanup deletes up to limit (default outbox.CleanupBatchDefault) records
// published more than Options.Retention ago and returns how many it deleted.
// With Retention 0 records are deleted on acknowledgement and there is
// nothing to clean, but records kept under an earlier Retention are deleted.
func (s *Store) Cleanup(ctx context.Context, limit int) (int64, error) {
	if err := s.check("cleanup"); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = outbox.CleanupBatchDefault
	}
	tag, err := s.pool.Exec(ctx, s.q.cleanup, s.planArgs(interval(s.opts.Retention), limit)...)
	if err != nil {
		return 0, s.wrap("cleanup", err)
	}
	return tag.RowsAffected(), nil
}
