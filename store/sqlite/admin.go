package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"
)

// CountDeadLetters returns how many dead letters match f (Limit and After
// ignored).
func (s *Store) CountDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("count dead letters"); err != nil {
		return 0, err
	}
	where, args, err := s.deadLetterWhere(f)
	if err != nil {
		return 0, fmt.Errorf("sqlite: count dead letters: %w", err)
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM "+s.n.deadLetters+where, args...).Scan(&n); err != nil {
		return 0, s.wrap("count dead letters", err)
	}
	return n, nil
}

// Columns of a FindMessages query: id, state, partition, seq, topic, key,
// payload, headers, created_at, attempts, next_attempt_at, last_error,
// failed_at, published_at.
const (
	findMessageColumns = `id, CASE WHEN published_at IS NULL THEN 'outstanding' ELSE 'published' END, partition, seq, topic, key,
    payload, headers, created_at, attempts, next_attempt_at, coalesce(last_error, ''), NULL, published_at`
	findDeadColumns = `id, 'dead', partition, 0, topic, key,
    payload, headers, created_at, attempts, NULL, last_error, failed_at, NULL`
)

// FindMessages looks messages up by ID or by key: the outstanding messages
// of the key's partition (on the pending index), the dead letters (on
// their key index), and among the [outbox.FindPublishedWindow] most recently
// published messages kept by retention.
func (s *Store) FindMessages(ctx context.Context, fq outbox.FindQuery) (*outbox.FindResult, error) {
	if err := s.check("find messages"); err != nil {
		return nil, err
	}
	limit, err := fq.Check()
	if err != nil {
		return nil, err
	}
	res := &outbox.FindResult{Messages: []outbox.FoundMessage{}}
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		query := func(q string, args ...any) error {
			rows, err := tx.QueryContext(ctx, q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			var found []outbox.FoundMessage
			for rows.Next() {
				m, err := scanFound(rows)
				if err != nil {
					return err
				}
				found = append(found, m)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if len(found) > limit {
				found, res.Truncated = found[:limit], true
			}
			res.Messages = append(res.Messages, found...)
			return nil
		}
		if fq.ID != "" {
			return query(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` WHERE id = ?1
UNION ALL
SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+` WHERE id = ?1`, fq.ID)
		}
		p, err := readPartitions(ctx, tx, s.n)
		if err != nil {
			return err
		}
		part := outbox.PartitionOf(fq.Key, p)
		if err := query(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` INDEXED BY `+s.n.pendingIdx+`
WHERE partition = ? AND published_at IS NULL AND key = ? ORDER BY seq LIMIT ?`, part, fq.Key, limit+1); err != nil {
			return err
		}
		if err := query(`SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+`
WHERE key = ? ORDER BY failed_at, id LIMIT ?`, fq.Key, limit+1); err != nil {
			return err
		}
		if err := query(`SELECT `+findMessageColumns+` FROM (
    SELECT * FROM `+s.n.messages+` WHERE published_at IS NOT NULL ORDER BY published_at DESC LIMIT ?
) WHERE partition = ? AND key = ? ORDER BY published_at DESC LIMIT ?`, outbox.FindPublishedWindow, part, fq.Key, limit+1); err != nil {
			return err
		}
		var full bool
		if err := tx.QueryRowContext(ctx, `SELECT count(*) >= ?1 FROM (SELECT 1 FROM `+s.n.messages+
			` WHERE published_at IS NOT NULL LIMIT ?1)`, outbox.FindPublishedWindow).Scan(&full); err != nil {
			return err
		}
		if full {
			res.Unsearched = map[outbox.MessageState]string{outbox.StatePublished: outbox.PublishedWindowReason(outbox.FindPublishedWindow)}
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap("find messages", err)
	}
	return res, nil
}

// scanFound scans the find columns.
func scanFound(rows *sql.Rows) (outbox.FoundMessage, error) {
	var (
		m                         outbox.FoundMessage
		state                     string
		headers                   sql.NullString
		created                   int64
		next, failed, publishedAt sql.NullInt64
	)
	if err := rows.Scan(&m.ID, &state, &m.Partition, &m.Seq, &m.Topic, &m.Key, &m.Payload, &headers, &created,
		&m.Attempts, &next, &m.LastError, &failed, &publishedAt); err != nil {
		return m, err
	}
	m.State = outbox.MessageState(state)
	var err error
	if m.Headers, err = decodeHeaders(headers); err != nil {
		return m, fmt.Errorf("message %s: %w", m.ID, err)
	}
	m.CreatedAt = fromNanos(sql.NullInt64{Int64: created, Valid: true})
	m.NextAttemptAt, m.FailedAt, m.PublishedAt = fromNanos(next), fromNanos(failed), fromNanos(publishedAt)
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}
