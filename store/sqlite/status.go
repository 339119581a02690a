package sqlite

import (
	"context"
	"database/sql"

	"github.com/outboxrelay/outbox"
)

// Status returns a snapshot of the outbox: the unpublished backlog in
// total, per topic and per partition, each partition's lease (Owner only
// while the lease is live), the dead-letter count and the live relay
// nodes with the number of live leases each holds. It reads one snapshot
// and counts rows, so it costs time proportional to the backlog.
func (s *Store) Status(ctx context.Context) (*outbox.Status, error) {
	if err := s.check("status"); err != nil {
		return nil, err
	}
	st := &outbox.Status{Topics: []outbox.TopicCount{}, Partitions: []outbox.PartitionStatus{}, Relays: []outbox.RelayStatus{}}
	now := nanos(s.now())
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		var oldest sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT count(*), min(created_at) FROM "+s.n.messages+
			" WHERE published_at IS NULL").Scan(&st.Outstanding, &oldest); err != nil {
			return err
		}
		st.OldestCreatedAt = fromNanos(oldest)

		rows, err := tx.QueryContext(ctx, "SELECT topic, count(*), min(created_at) FROM "+s.n.messages+
			" WHERE published_at IS NULL GROUP BY topic ORDER BY topic")
		if err != nil {
			return err
		}
		for rows.Next() {
			var tc outbox.TopicCount
			var oldest sql.NullInt64
			if err := rows.Scan(&tc.Topic, &tc.Count, &oldest); err != nil {
				rows.Close()
				return err
			}
			tc.OldestCreatedAt = fromNanos(oldest)
			st.Topics = append(st.Topics, tc)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		perPart := map[int]int64{}
		rows, err = tx.QueryContext(ctx, "SELECT partition, count(*) FROM "+s.n.messages+" INDEXED BY "+s.n.pendingIdx+
			" WHERE published_at IS NULL GROUP BY partition")
		if err != nil {
			return err
		}
		for rows.Next() {
			var p int
			var n int64
			if err := rows.Scan(&p, &n); err != nil {
				rows.Close()
				return err
			}
			perPart[p] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		held := map[string]int{}
		rows, err = tx.QueryContext(ctx, s.q.leases)
		if err != nil {
			return err
		}
		for rows.Next() {
			var r leaseRow
			if err := rows.Scan(&r.partition, &r.owner, &r.epoch, &r.expiresAt); err != nil {
				rows.Close()
				return err
			}
			ps := outbox.PartitionStatus{Partition: r.partition, Outstanding: perPart[r.partition], Epoch: r.epoch}
			if r.owner.Valid && r.expiresAt.Valid && r.expiresAt.Int64 >= now {
				ps.Owner = r.owner.String
				ps.LeaseExpiresAt = fromNanos(r.expiresAt)
				held[ps.Owner]++
			}
			st.Partitions = append(st.Partitions, ps)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+s.n.deadLetters).Scan(&st.DeadLetters); err != nil {
			return err
		}

		rows, err = tx.QueryContext(ctx, "SELECT node, expires_at FROM "+s.n.relays+" WHERE expires_at >= ? ORDER BY node", now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rs outbox.RelayStatus
			var exp sql.NullInt64
			if err := rows.Scan(&rs.Node, &exp); err != nil {
				return err
			}
			rs.ExpiresAt = fromNanos(exp)
			rs.Partitions = held[rs.Node]
			st.Relays = append(st.Relays, rs)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.wrap("status", err)
	}
	return st, nil
}
