package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

// Status describes the backlog, leases, dead letters and live relays, read
// in one round trip (a batch in a read-only repeatable-read transaction, so
// the counts agree). It scans the pending records twice (per topic, with
// the totals derived from it; per partition, on the pending index): meant
// for `outbox status` and the console, not for a hot loop. A second
// round trip reads the xmin horizon (XminHorizon). With 1,000,000
// pending records it takes about a second on a small machine.
func (s *Store) Status(ctx context.Context) (*outbox.Status, error) {
	if err := s.check("status"); err != nil {
		return nil, err
	}
	if _, err := s.isRing(ctx, s.pool); err != nil { // see sendBatch
		return nil, s.wrap("status", err)
	}
	st := &outbox.Status{Topics: []outbox.TopicCount{}, Partitions: []outbox.PartitionStatus{}, Relays: []outbox.RelayStatus{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`SELECT topic, count(*) AS n, min(created_at) FROM ` + s.n.messages + ` WHERE published_at IS NULL GROUP BY topic ORDER BY n DESC, topic`).Query(func(rows pgx.Rows) error {
			var err error
			st.Topics, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.TopicCount, error) {
				var tc outbox.TopicCount
				err := row.Scan(&tc.Topic, &tc.Count, &tc.OldestCreatedAt)
				return tc, err
			})
			// The totals are the topics' (one scan of the pending rows fewer).
			for _, tc := range st.Topics {
				st.Outstanding += tc.Count
				if st.OldestCreatedAt.IsZero() || tc.OldestCreatedAt.Before(st.OldestCreatedAt) {
					st.OldestCreatedAt = tc.OldestCreatedAt
				}
			}
			return err
		})
		b.Queue(`SELECT l.partition, coalesce(c.n, 0), coalesce(l.owner, ''), l.epoch, l.expires_at
FROM ` + s.n.leases + ` l
LEFT JOIN (SELECT partition, count(*) AS n FROM ` + s.n.messages + ` WHERE published_at IS NULL GROUP BY partition) c
    ON c.partition = l.partition
ORDER BY l.partition`).Query(func(rows pgx.Rows) error {
			var err error
			st.Partitions, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.PartitionStatus, error) {
				var (
					ps  outbox.PartitionStatus
					exp pgtype.Timestamptz
				)
				err := row.Scan(&ps.Partition, &ps.Outstanding, &ps.Owner, &ps.Epoch, &exp)
				if exp.Valid {
					ps.LeaseExpiresAt = exp.Time
				}
				return ps, err
			})
			return err
		})
		b.Queue(`SELECT count(*) FROM ` + s.n.deadLetters).QueryRow(func(row pgx.Row) error {
			return row.Scan(&st.DeadLetters)
		})
		b.Queue(`SELECT r.node, r.expires_at,
    (SELECT count(*) FROM ` + s.n.leases + ` l WHERE l.owner = r.node AND l.expires_at > now())
FROM ` + s.n.relays + ` r
WHERE r.expires_at >= now()
ORDER BY r.node`).Query(func(rows pgx.Rows) error {
			var err error
			st.Relays, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.RelayStatus, error) {
				var (
					rs  outbox.RelayStatus
					exp time.Time
				)
				err := row.Scan(&rs.Node, &exp, &rs.Partitions)
				rs.ExpiresAt = exp
				return rs, err
			})
			return err
		})
		return s.sendBatch(ctx, tx, b)
	})
	if err != nil {
		return nil, s.wrap("status", err)
	}
	// Outside the snapshot: the horizon is the server's, not the tables'.
	if st.XminHorizon, err = s.XminHorizon(ctx); err != nil {
		return nil, err
	}
	return st, nil
}
