package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

var (
	_ outbox.BacklogReader = (*Store)(nil)
	_ outbox.LeaseReader   = (*Store)(nil)
)

// backlogSQL are the statements of Backlog. Their cost does not grow with
// the outbox beyond limit rows (plans with 1,000,000 outstanding rows, 64
// partitions):
//
// heads, one index probe per partition:
//
//	Nested Loop
//	  ->  Function Scan on generate_series p
//	  ->  Limit
//	        ->  Index Scan using <prefix>_messages_pending_idx on <prefix>_messages m
//	              Index Cond: (partition = p.p)
//
// sample, at most limit rows in physical order:
//
//	Limit -> Sort -> WindowAgg -> HashAggregate
//	  ->  Limit
//	        ->  Seq Scan on <prefix>_messages  Filter: (published_at IS NULL)
//
// dead letters, at most limit rows:
//
//	Aggregate -> Limit -> Seq Scan (or Index Only Scan) on <prefix>_dead_letters
//
// leases (shared with Leases), one row per partition lease and per relay:
//
//	HashAggregate -> Append
//	  ->  HashAggregate -> Seq Scan on <prefix>_leases
//	  ->  Subquery Scan -> Seq Scan on <prefix>_relays
type backlogSQL struct{ heads, sample, dead, leases string }

func newBacklogSQL(n names) backlogSQL {
	return backlogSQL{
		heads: `SELECT h.topic, h.created_at
FROM generate_series(0, (SELECT partitions FROM ` + n.meta + `) - 1) AS p
CROSS JOIN LATERAL (
    SELECT m.topic, m.created_at FROM ` + n.messages + ` m
    WHERE m.partition = p AND m.published_at IS NULL
    ORDER BY m.seq LIMIT 1
) h`,
		sample: `SELECT topic, n, oldest, sum(n) OVER ()::bigint
FROM (
    SELECT topic, count(*) AS n, min(created_at) AS oldest
    FROM (SELECT topic, created_at FROM ` + n.messages + ` WHERE published_at IS NULL LIMIT $1) s
    GROUP BY topic
) g
ORDER BY topic
LIMIT $2`,
		dead:   `SELECT count(*) FROM (SELECT 1 FROM ` + n.deadLetters + ` LIMIT $1) d`,
		leases: leasesSQL(n),
	}
}

// leasesSQL is the statement of Leases, and Backlog's leases: per live
// node, the unexpired leases it holds.
func leasesSQL(n names) string {
	return `SELECT node, sum(n)::integer FROM (
    SELECT owner AS node, count(*) AS n FROM ` + n.leases + ` WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner
    UNION ALL
    SELECT node, 0 FROM ` + n.relays + ` WHERE expires_at >= now()
) x
GROUP BY node`
}

// scanLeases reads the rows of leasesSQL into leases.
func scanLeases(rows pgx.Rows, leases map[string]int) error {
	defer rows.Close()
	for rows.Next() {
		var (
			node string
			n    int
		)
		if err := rows.Scan(&node, &n); err != nil {
			return err
		}
		leases[node] = n
	}
	return rows.Err()
}

// Leases reads, per live relay node, the unexpired partition leases it
// holds, a live node holding none with zero (see [outbox.LeaseReader]): one
// statement on the leases and relays tables, the figures Backlog reports
// in its Leases, without reading the outbox.
func (s *Store) Leases(ctx context.Context) (map[string]int, error) {
	if err := s.check("leases"); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, leasesSQL(s.n))
	if err == nil {
		leases := map[string]int{}
		if err = scanLeases(rows, leases); err == nil {
			return leases, nil
		}
	}
	return nil, s.wrap("leases", err)
}

// Backlog measures the backlog for gauges, reading at most limit
// outstanding messages and limit dead letters (see [outbox.BacklogReader]),
// in one round trip: a batch in a read-only repeatable-read transaction,
// so that its figures agree. The oldest message overall comes from the
// first pending row of each partition (one index probe each), so it is
// exact at any size; per-topic counts are exact while fewer than limit
// messages are outstanding.
func (s *Store) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	if err := s.check("backlog"); err != nil {
		return nil, err
	}
	if limit < 1 || limit > outbox.BacklogScanLimitMax {
		return nil, fmt.Errorf("postgres: backlog: limit must be between 1 and %d, got %d", outbox.BacklogScanLimitMax, limit)
	}
	if _, err := s.Partitions(ctx); err != nil { // and the layout, once (see sendBatch)
		return nil, err
	}
	q := newBacklogSQL(s.n)
	var (
		b        *outbox.Backlog
		heads    []outbox.TopicBacklog
		sampled  []outbox.TopicBacklog
		total    int64
		moreTops bool
	)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		b = &outbox.Backlog{Leases: map[string]int{}}
		heads, sampled, total, moreTops = nil, nil, 0, false
		batch := &pgx.Batch{}
		batch.Queue(q.heads).Query(func(rows pgx.Rows) error {
			var err error
			heads, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.TopicBacklog, error) {
				var h outbox.TopicBacklog
				err := row.Scan(&h.Topic, &h.OldestCreatedAt)
				return h, err
			})
			return err
		})
		batch.Queue(q.sample, limit, outbox.BacklogTopicsMax+1).Query(func(rows pgx.Rows) error {
			var err error
			sampled, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.TopicBacklog, error) {
				var (
					t      outbox.TopicBacklog
					oldest pgtype.Timestamptz
				)
				err := row.Scan(&t.Topic, &t.Outstanding, &oldest, &total)
				t.OldestCreatedAt = oldest.Time
				return t, err
			})
			return err
		})
		batch.Queue(q.dead, limit).QueryRow(func(row pgx.Row) error {
			return row.Scan(&b.DeadLetters)
		})
		batch.Queue(q.leases).Query(func(rows pgx.Rows) error {
			return scanLeases(rows, b.Leases)
		})
		return s.sendBatch(ctx, tx, batch)
	})
	if err != nil {
		return nil, s.wrap("backlog", err)
	}
	if len(sampled) > outbox.BacklogTopicsMax {
		sampled, moreTops = sampled[:outbox.BacklogTopicsMax], true
	}
	b.Outstanding = total
	b.Exact = total < int64(limit) && !moreTops
	b.Topics = sampled
	b.AddHeads(heads)
	return b, nil
}
