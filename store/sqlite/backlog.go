package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var (
	_ outbox.BacklogReader = (*Store)(nil)
	_ outbox.LeaseReader   = (*Store)(nil)
)

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
		return s.readLeases(ctx, tx, now, b.Leases)
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

// Leases reads, per live relay node, the unexpired partition leases it
// holds, a live node holding none with zero (see [outbox.LeaseReader]): the
// figures Backlog reports in its Leases, from the leases and relays
// tables alone.
func (s *Store) Leases(ctx context.Context) (map[string]int, error) {
	if err := s.check("leases"); err != nil {
		return nil, err
	}
	leases := map[string]int{}
	now := nanos(s.now())
	if err := s.readTx(ctx, func(tx *sql.Tx) error { return s.readLeases(ctx, tx, now, leases) }); err != nil {
		return nil, s.wrap("leases", err)
	}
	return leases, nil
}

// readLeases adds to leases, per node whose heartbeat is live at now, the
// leases it holds unexpired at now (Leases and Backlog).
func (s *Store) readLeases(ctx context.Context, tx *sql.Tx, now int64, leases map[string]int) error {
	return collect(ctx, tx, func(rows *sql.Rows) error {
		var (
			node string
			n    int
		)
		if err := rows.Scan(&node, &n); err != nil {
			return err
		}
		leases[node] = n
		return nil
	}, `SELECT node, sum(n) FROM (
    SELECT owner AS node, count(*) AS n FROM `+s.n.leases+` WHERE owner IS NOT NULL AND expires_at >= ?1 GROUP BY owner
    UNION ALL
    SELECT node, 0 FROM `+s.n.relays+` WHERE expires_at >= ?1
) GROUP BY node`, now)
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
