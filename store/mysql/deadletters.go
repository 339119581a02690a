package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// DeadLetterLimitDefault is how many dead letters DeadLetters lists when the
// filter sets no Limit.
const DeadLetterLimitDefault = storepolicy.DeadLetterLimitDefault

// deadLetterWhere returns the WHERE clause (with a leading space, or empty)
// and its arguments for f.
func (s *Store) deadLetterWhere(f outbox.DeadLetterFilter) (string, []any, error) {
	if len(f.IDs) > maxParams-10 {
		return "", nil, fmt.Errorf("DeadLetterFilter.IDs has %d IDs; at most %d fit one call: split the list", len(f.IDs), maxParams-10)
	}
	var conds []string
	var args []any
	if f.Topic != "" {
		conds = append(conds, "topic = ?")
		args = append(args, []byte(f.Topic))
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id IN ("+placeholders(len(f.IDs))+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if !f.FailedBefore.IsZero() {
		conds = append(conds, "failed_at < ?")
		args = append(args, f.FailedBefore.UTC())
	}
	if f.Key != "" {
		conds = append(conds, "msg_key = ?")
		args = append(args, []byte(f.Key))
	}
	if f.ErrorContains != "" {
		// LOCATE, not LIKE: the text is matched literally, wildcards and
		// all; LOWER on both sides ignores case under the binary collation.
		conds = append(conds, "LOCATE(LOWER(?), LOWER(last_error)) > 0")
		args = append(args, f.ErrorContains)
	}
	if !f.FailedAfter.IsZero() {
		conds = append(conds, "failed_at >= ?")
		args = append(args, f.FailedAfter.UTC())
	}
	if len(conds) == 0 {
		return "", nil, nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args, nil
}

// DeadLetters lists the dead letters matching f, oldest failure first, at
// most f.Limit (default [DeadLetterLimitDefault]).
func (s *Store) DeadLetters(ctx context.Context, f outbox.DeadLetterFilter) ([]outbox.DeadLetter, error) {
	if err := s.check("dead letters"); err != nil {
		return nil, err
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("mysql: dead letters: DeadLetterFilter.Limit must not be negative, got %d", f.Limit)
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return nil, fmt.Errorf("mysql: dead letters: %w", err)
	}
	limit := f.Limit
	if limit == 0 {
		limit = DeadLetterLimitDefault
	}
	if f.After != nil {
		if err := outbox.ValidateID(f.After.ID); err != nil {
			return nil, fmt.Errorf("mysql: dead letters: DeadLetterFilter.After.ID: %w", err)
		}
		if where == "" {
			where = " WHERE TRUE"
		}
		// Spelt out, not a row comparison, so that the index serves it.
		where += " AND (failed_at > ? OR (failed_at = ? AND id > ?))"
		at := f.After.FailedAt.UTC().Truncate(time.Microsecond)
		args = append(args, at, at, f.After.ID)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT id, topic, msg_key, payload, headers, created_at, attempts, last_error, failed_at FROM "+
		s.n.deadLetters+where+" ORDER BY failed_at, id LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, s.wrap("dead letters", err)
	}
	defer rows.Close()
	dls := []outbox.DeadLetter{}
	for rows.Next() {
		var (
			d          outbox.DeadLetter
			topic, key []byte
			headers    sql.NullString
		)
		if err := rows.Scan(&d.ID, &topic, &key, &d.Payload, &headers, &d.CreatedAt, &d.Attempts, &d.LastError, &d.FailedAt); err != nil {
			return nil, s.wrap("dead letters", err)
		}
		d.Topic, d.Key = string(topic), string(key)
		if d.Headers, err = decodeHeaders(headers); err != nil {
			// Dead-lettered because its headers could not be decoded: its
			// LastError says so; list it without them.
			d.Headers = nil
		}
		if d.Payload == nil {
			d.Payload = []byte{}
		}
		d.CreatedAt, d.FailedAt = d.CreatedAt.UTC(), d.FailedAt.UTC()
		dls = append(dls, d)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("dead letters", err)
	}
	return dls, nil
}

// Requeue moves the dead letters matching f (f.Limit is ignored) back into
// the outbox, in one transaction, after every message already there (they
// get new seqs, in the order they originally had: INSERT … SELECT … ORDER
// BY seq draws AUTO_INCREMENT in that order), with their ID, key,
// partition and CreatedAt kept and their attempts reset. It returns how
// many it moved. Relays subscribed to this Store are woken.
func (s *Store) Requeue(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("requeue"); err != nil {
		return 0, err
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return 0, fmt.Errorf("mysql: requeue: %w", err)
	}
	var n int64
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		// Lock the dead letters first, so that the copy and the delete
		// see the same rows.
		if _, err := tx.ExecContext(ctx, "SELECT id FROM "+s.n.deadLetters+where+" FOR UPDATE", args...); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "INSERT INTO "+s.n.messages+" (id, part, topic, msg_key, payload, headers, created_at)"+
			" SELECT id, part, topic, msg_key, payload, headers, created_at FROM "+s.n.deadLetters+where+" ORDER BY seq", args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		res, err = tx.ExecContext(ctx, "DELETE FROM "+s.n.deadLetters+where, args...)
		if err != nil {
			return err
		}
		if m, err := res.RowsAffected(); err != nil {
			return err
		} else if m != n {
			return fmt.Errorf("moved %d dead letters but deleted %d; rolled back, try again", n, m)
		}
		return nil
	})
	if err != nil {
		return 0, s.wrap("requeue", err)
	}
	if n > 0 {
		s.bc.Kick(nil) // any partition
	}
	return n, nil
}

// PurgeDeadLetters deletes the dead letters matching f (f.Limit is
// ignored) for good and returns how many it deleted.
func (s *Store) PurgeDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("purge dead letters"); err != nil {
		return 0, err
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return 0, fmt.Errorf("mysql: purge dead letters: %w", err)
	}
	res, err := s.db.ExecContext(ctx, "DELETE FROM "+s.n.deadLetters+where, args...)
	if err != nil {
		return 0, s.wrap("purge dead letters", err)
	}
	n, err := res.RowsAffected()
	return n, s.wrap("purge dead letters", err)
}

// CountDeadLetters returns how many dead letters match f (Limit and After
// ignored).
func (s *Store) CountDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("count dead letters"); err != nil {
		return 0, err
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return 0, fmt.Errorf("mysql: count dead letters: %w", err)
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM "+s.n.deadLetters+where, args...).Scan(&n); err != nil {
		return 0, s.wrap("count dead letters", err)
	}
	return n, nil
}
