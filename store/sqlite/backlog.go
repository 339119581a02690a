package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var _ outbox.BacklogReader = (*Store)(nil)

// Backlog measures the backlog for gauges in one read transaction, reading
// at most limit outstanding messages and limit dead letters (see
// [outbox.BacklogReader]). The oldest message overall comes from the first
// pending row of each partition, through the pending index, so it is exact
// at any size; per-topic counts are exact while fewer than limit messages
// are outstanding.
func (s *Store) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	if err := s.check("backlog"); err != nil {
		return nil, err
	}
	if limit < 1 || limit > outbox.BacklogScanLimitMax {
		return nil, fmt.Errorf("sqlite: backlog: limit must be between 1 and %d, got %d", outbox.BacklogScanLimitMax, limit)
	}
	b := &outbox.Backlog{Leases: map[string]int{}}
	var heads []outbox.TopicBacklog
	now := nanos(s.now())
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var (
				t      outbox.TopicBacklog
				oldest sql.NullInt64
			)
			if err := rows.Scan(&t.Topic, &t.Outstanding, &oldest); err != nil {
				return err
			}
			t.OldestCreatedAt = fromNanos(oldest)
			b.Outstanding += t.Outstanding
			b.Topics = append(b.Topics, t)
			return nil
		}, `SELECT topic, count(*), min(created_at) FROM (SELECT topic, created_at FROM `+s.n.messages+
			` WHERE published_at IS NULL LIMIT ?) GROUP BY topic ORDER BY topic`, limit); err != nil {
			return err
		}
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var (
				h       outbox.TopicBacklog
				created sql.NullInt64
			)
			if err := rows.Scan(&h.Topic, &created); err != nil {
				return err
			}
			h.OldestCreatedAt = fromNanos(created)
			heads = append(heads, h)
			return nil
		}, `WITH RECURSIVE p(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM p WHERE x + 1 < (SELECT partitions FROM `+s.n.meta+`))
SELECT m.topic, m.created_at FROM p JOIN `+s.n.messages+` m ON m.seq = (
    SELECT seq FROM `+s.n.messages+` INDEXED BY `+s.n.pendingIdx+`
    WHERE partition = p.x AND published_at IS NULL ORDER BY seq LIMIT 1)`); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+s.n.deadLetters+` LIMIT ?)`, limit).Scan(&b.DeadLetters); err != nil {
			return err
		}
		return collect(ctx, tx, func(rows *sql.Rows) error {
			var (
				node string
				n    int
			)
			if err := rows.Scan(&node, &n); err != nil {
				return err
			}
			b.Leases[node] = n
			return nil
		}, `SELECT node, sum(n) FROM (
    SELECT owner AS node, count(*) AS n FROM `+s.n.leases+` WHERE owner IS NOT NULL AND expires_at >= ?1 GROUP BY owner
    UNION ALL
    SELECT node, 0 FROM `+s.n.relays+` WHERE expires_at >= ?1
) GROUP BY node`, now)
	})
	if err != nil {
		return nil, s.wrap("backlog", err)
	}
	b.Exact = b.Outstanding < int64(limit) && len(b.Topics) <= outbox.BacklogTopicsMax
	if len(b.Topics) > outbox.BacklogTopicsMax {
		b.Topics = b.Topics[:outbox.BacklogTopicsMax]
	}
	b.AddHeads(heads)
	return b, nil
}

// collect runs query and calls scan for each row.
func collect(ctx context.Context, tx *sql.Tx, scan func(*sql.Rows) error, query string, args ...any) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
