package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

const (
	// DeadLetterLimitDefault is how many dead letters DeadLetters lists when
	// the filter sets no Limit.
	DeadLetterLimitDefault = storepolicy.DeadLetterLimitDefault
	// DeadLettersLimitDefault is the former name of DeadLetterLimitDefault.
	//
	// Deprecated: use DeadLetterLimitDefault, the name the other stores use.
	DeadLettersLimitDefault = DeadLetterLimitDefault
)

// where returns the WHERE clause (with a leading space, or empty) and its
// arguments for f.
func (s *Store) deadLetterWhere(f outbox.DeadLetterFilter) (string, []any, error) {
	if len(f.IDs) > maxVariables-10 {
		return "", nil, fmt.Errorf("DeadLetterFilter.IDs has %d IDs; at most %d fit one call: split the list", len(f.IDs), maxVariables-10)
	}
	var conds []string
	var args []any
	if f.Topic != "" {
		conds = append(conds, "topic = ?")
		args = append(args, f.Topic)
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id IN ("+placeholders(len(f.IDs))+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if !f.FailedBefore.IsZero() {
		conds = append(conds, "failed_at < ?")
		args = append(args, nanos(f.FailedBefore))
	}
	if f.Key != "" {
		conds = append(conds, "key = ?")
		args = append(args, f.Key)
	}
	if f.ErrorContains != "" {
		// instr, not LIKE: the text is matched literally, wildcards and
		// all. SQLite's lower folds ASCII letters only.
		conds = append(conds, "instr(lower(last_error), lower(?)) > 0")
		args = append(args, f.ErrorContains)
	}
	if !f.FailedAfter.IsZero() {
		conds = append(conds, "failed_at >= ?")
		args = append(args, nanos(f.FailedAfter))
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
		return nil, fmt.Errorf("sqlite: dead letters: DeadLetterFilter.Limit must not be negative, got %d", f.Limit)
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return nil, fmt.Errorf("sqlite: dead letters: %w", err)
	}
	limit := f.Limit
	if limit == 0 {
		limit = DeadLetterLimitDefault
	}
	if f.After != nil {
		if err := outbox.ValidateID(f.After.ID); err != nil {
			return nil, fmt.Errorf("sqlite: dead letters: DeadLetterFilter.After.ID: %w", err)
		}
		where = cmp.Or(where, " WHERE true") + " AND (failed_at, id) > (?, ?)"
		args = append(args, nanos(f.After.FailedAt), f.After.ID)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT id, topic, key, payload, headers, created_at, attempts, last_error, failed_at FROM "+
		s.n.deadLetters+where+" ORDER BY failed_at, id LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, s.wrap("dead letters", err)
	}
	defer rows.Close()
	dls := []outbox.DeadLetter{}
	for rows.Next() {
		var (
			d       outbox.DeadLetter
			headers sql.NullString
			created int64
			failed  sql.NullInt64
		)
		if err := rows.Scan(&d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &created, &d.Attempts, &d.LastError, &failed); err != nil {
			return nil, s.wrap("dead letters", err)
		}
		if d.Headers, err = decodeHeaders(headers); err != nil {
			// Dead-lettered because its headers could not be decoded: its
			// LastError says so; list it without them.
			d.Headers = nil
		}
		d.CreatedAt = fromNanos(sql.NullInt64{Int64: created, Valid: true})
		d.FailedAt = fromNanos(failed)
		dls = append(dls, d)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("dead letters", err)
	}
	return dls, nil
}

// Requeue moves the dead letters matching f (f.Limit is ignored) back into
// the outbox, in one transaction, after every message already there (they
// get new seqs, in the order they originally had), with their ID, key,
// partition and CreatedAt kept and their attempts reset. It returns how
// many it moved. Relays subscribed to this Store are woken.
func (s *Store) Requeue(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("requeue"); err != nil {
		return 0, err
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return 0, fmt.Errorf("sqlite: requeue: %w", err)
	}
	var n int64
	err = s.inTx(ctx, func(c *sql.Conn) error {
		res, err := c.ExecContext(ctx, "INSERT INTO "+s.n.messages+" (id, partition, topic, key, payload, headers, created_at)"+
			" SELECT id, partition, topic, key, payload, headers, created_at FROM "+s.n.deadLetters+where+" ORDER BY seq", args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		res, err = c.ExecContext(ctx, "DELETE FROM "+s.n.deadLetters+where, args...)
		if err != nil {
			return err
		}
		if m, err := res.RowsAffected(); err != nil {
			return err
		} else if m != n {
			return fmt.Errorf("moved %d dead letters but deleted %d", n, m) // cannot happen: one snapshot under the write lock
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
		return 0, fmt.Errorf("sqlite: purge dead letters: %w", err)
	}
	var n int64
	err = s.inTx(ctx, func(c *sql.Conn) error {
		res, err := c.ExecContext(ctx, "DELETE FROM "+s.n.deadLetters+where, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.wrap("purge dead letters", err)
	}
	return n, nil
}
