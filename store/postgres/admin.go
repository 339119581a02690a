package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// CountDeadLetters returns how many dead letters match f (Limit and After
// ignored). With a topic or key it counts on an index; with an error text
// it reads every dead letter the other filters leave.
func (s *Store) CountDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("count dead letters"); err != nil {
		return 0, err
	}
	var q sqlBuilder
	q.WriteString(`SELECT count(*) FROM ` + s.n.deadLetters + ` d`)
	if err := deadLetterWhere(&q, f); err != nil {
		return 0, fmt.Errorf("postgres: count dead letters: %w", err)
	}
	var n int64
	if err := s.pool.QueryRow(ctx, q.String(), q.args...).Scan(&n); err != nil {
		return 0, s.wrap("count dead letters", err)
	}
	return n, nil
}

// findColumns are the columns every part of a FindMessages query returns:
// id, state, partition, seq, topic, key, payload, headers, created_at,
// attempts, next_attempt_at, last_error, failed_at, published_at.
const (
	findMessageColumns = `m.id, CASE WHEN m.published_at IS NULL THEN 'outstanding' ELSE 'published' END, m.partition, m.seq, m.topic, m.key, m.payload,
    m.headers::text, m.created_at, m.attempts, m.next_attempt_at, coalesce(m.last_error, ''), NULL::timestamptz, m.published_at`
	findDeadColumns = `d.id, 'dead', d.partition, 0::bigint, d.topic, d.key, d.payload,
    d.headers::text, d.created_at, d.attempts, NULL::timestamptz, d.last_error, d.failed_at, NULL::timestamptz`
)

// FindMessages looks messages up by ID (primary keys of the messages and
// dead letters) or by key: the outstanding messages of the key's partition
// (on the pending index, so its cost grows with that partition's backlog),
// the dead letters (on their key index), and among the
// [outbox.FindPublishedWindow] most recently published messages kept by retention.
func (s *Store) FindMessages(ctx context.Context, fq outbox.FindQuery) (*outbox.FindResult, error) {
	if err := s.check("find messages"); err != nil {
		return nil, err
	}
	limit, err := fq.Check()
	if err != nil {
		return nil, err
	}
	res := &outbox.FindResult{Messages: []outbox.FoundMessage{}}
	b := &pgx.Batch{}
	collect := func(rows pgx.Rows) error {
		found, err := pgx.CollectRows(rows, scanFound)
		if err != nil {
			return err
		}
		if len(found) > limit {
			found, res.Truncated = found[:limit], true
		}
		res.Messages = append(res.Messages, found...)
		return nil
	}
	if fq.ID != "" {
		u, err := parseUUID(fq.ID)
		if err != nil {
			return nil, fmt.Errorf("postgres: FindQuery.ID: %w", err)
		}
		b.Queue(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` m WHERE m.id = $1
UNION ALL
SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+` d WHERE d.id = $1`, u).Query(collect)
	} else {
		p, err := s.Partitions(ctx)
		if err != nil {
			return nil, err
		}
		part := outbox.PartitionOf(fq.Key, p)
		b.Queue(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` m
WHERE m.partition = $1 AND m.published_at IS NULL AND m.key = $2
ORDER BY m.seq LIMIT $3`, part, fq.Key, limit+1).Query(collect)
		b.Queue(`SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+` d
WHERE d.key = $1 ORDER BY d.failed_at, d.id LIMIT $2`, fq.Key, limit+1).Query(collect)
		b.Queue(`SELECT `+findMessageColumns+` FROM (
    SELECT * FROM `+s.n.messages+` WHERE published_at IS NOT NULL ORDER BY published_at DESC LIMIT $3
) m
WHERE m.partition = $1 AND m.key = $2
ORDER BY m.published_at DESC LIMIT $4`, part, fq.Key, outbox.FindPublishedWindow, limit+1).Query(collect)
		// Whether the window was full: then older published messages were
		// not searched.
		b.Queue(`SELECT count(*) >= $1 FROM (SELECT 1 FROM `+s.n.messages+` WHERE published_at IS NOT NULL LIMIT $1) x`,
			outbox.FindPublishedWindow).QueryRow(func(row pgx.Row) error {
			var full bool
			if err := row.Scan(&full); err != nil {
				return err
			}
			if full {
				res.Unsearched = map[outbox.MessageState]string{outbox.StatePublished: outbox.PublishedWindowReason(outbox.FindPublishedWindow)}
			}
			return nil
		})
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, s.wrap("find messages", err)
	}
	return res, nil
}

// scanFound scans the find columns.
func scanFound(row pgx.CollectableRow) (outbox.FoundMessage, error) {
	var (
		m                      outbox.FoundMessage
		state                  string
		headers                *string
		id                     [16]byte
		next, failed, publishd pgtype.Timestamptz
	)
	if err := row.Scan(&id, &state, &m.Partition, &m.Seq, &m.Topic, &m.Key, &m.Payload, &headers, &m.CreatedAt,
		&m.Attempts, &next, &m.LastError, &failed, &publishd); err != nil {
		return m, err
	}
	m.ID = uuid.Format(id)
	m.State = outbox.MessageState(state)
	m.NextAttemptAt, m.FailedAt, m.PublishedAt = next.Time, failed.Time, publishd.Time
	if headers != nil {
		if err := json.Unmarshal([]byte(*headers), &m.Headers); err != nil {
			return m, fmt.Errorf("message headers: %w", err)
		}
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}
