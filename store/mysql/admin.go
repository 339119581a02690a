package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxrelay/outbox"
)

// readTx runs fn in a read-only transaction (REPEATABLE READ, the server default): one
// consistent snapshot that does not wait for writers.
func (s *Store) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// Columns of a FindMessages query: id, state, part, seq, topic, key,
// payload, headers, created_at, attempts, next_attempt_at, last_error,
// failed_at, published_at.
const (
	findMessageColumns = `id, CASE WHEN published_at IS NULL THEN 'outstanding' ELSE 'published' END, part, seq, topic, msg_key,
    payload, headers, created_at, attempts, next_attempt_at, coalesce(last_error, ''), NULL, published_at`
	findDeadColumns = `id, 'dead', part, 0, topic, msg_key,
    payload, headers, created_at, attempts, NULL, last_error, failed_at, NULL`
)

// FindMessages looks messages up by ID or by key: the outstanding messages
// of the key's partition (on the pending index), the dead letters (on
// their key index), and among the [outbox.FindPublishedWindow] most
// recently published messages kept by retention.
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
			return query(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` WHERE id = ?
UNION ALL
SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+` WHERE id = ?`, fq.ID, fq.ID)
		}
		p, err := readPartitions(ctx, tx, s.n)
		if err != nil {
			return err
		}
		part := outbox.PartitionOf(fq.Key, p)
		key := []byte(fq.Key)
		if err := query(`SELECT `+findMessageColumns+` FROM `+s.n.messages+` FORCE INDEX (pending_idx)
WHERE part = ? AND published_at IS NULL AND msg_key = ? ORDER BY seq LIMIT ?`, part, key, limit+1); err != nil {
			return err
		}
		if err := query(`SELECT `+findDeadColumns+` FROM `+s.n.deadLetters+`
WHERE msg_key = ? ORDER BY failed_at, id LIMIT ?`, key, limit+1); err != nil {
			return err
		}
		if err := query(`SELECT `+findMessageColumns+` FROM (
    SELECT * FROM `+s.n.messages+` WHERE published_at IS NOT NULL ORDER BY published_at DESC LIMIT ?
) w WHERE part = ? AND msg_key = ? ORDER BY published_at DESC LIMIT ?`, outbox.FindPublishedWindow, part, key, limit+1); err != nil {
			return err
		}
		var kept int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+s.n.messages+
			` WHERE published_at IS NOT NULL LIMIT ?) w`, outbox.FindPublishedWindow).Scan(&kept); err != nil {
			return err
		}
		if kept >= outbox.FindPublishedWindow {
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
		topic, key                []byte
		headers                   sql.NullString
		next, failed, publishedAt sql.NullTime
	)
	if err := rows.Scan(&m.ID, &state, &m.Partition, &m.Seq, &topic, &key, &m.Payload, &headers, &m.CreatedAt,
		&m.Attempts, &next, &m.LastError, &failed, &publishedAt); err != nil {
		return m, err
	}
	m.Topic, m.Key = string(topic), string(key)
	m.State = outbox.MessageState(state)
	var err error
	if m.Headers, err = decodeHeaders(headers); err != nil {
		return m, fmt.Errorf("message %s: %w", m.ID, err)
	}
	m.CreatedAt = m.CreatedAt.UTC()
	m.NextAttemptAt, m.FailedAt, m.PublishedAt = fromNull(next), fromNull(failed), fromNull(publishedAt)
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}

// Status returns a snapshot of the outbox: the unpublished backlog in
// total, per topic and per partition, each partition's lease (Owner only
// while the lease is live, by the server's clock), the dead-letter count
// and the live relay nodes with the number of live leases each holds. It
// reads one snapshot and counts rows, so it costs time proportional to the
// backlog (outbox.BacklogReader is the bounded measure).
func (s *Store) Status(ctx context.Context) (*outbox.Status, error) {
	if err := s.check("status"); err != nil {
		return nil, err
	}
	st := &outbox.Status{Topics: []outbox.TopicCount{}, Partitions: []outbox.PartitionStatus{}, Relays: []outbox.RelayStatus{}}
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		var now sql.NullTime
		if err := tx.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&now); err != nil {
			return err
		}
		var oldest sql.NullTime
		if err := tx.QueryRowContext(ctx, "SELECT count(*), min(created_at) FROM "+s.n.messages+
			" WHERE published_at IS NULL").Scan(&st.Outstanding, &oldest); err != nil {
			return err
		}
		st.OldestCreatedAt = fromNull(oldest)
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var tc outbox.TopicCount
			var topic []byte
			var oldest sql.NullTime
			if err := rows.Scan(&topic, &tc.Count, &oldest); err != nil {
				return err
			}
			tc.Topic = string(topic)
			tc.OldestCreatedAt = fromNull(oldest)
			st.Topics = append(st.Topics, tc)
			return nil
		}, "SELECT topic, count(*), min(created_at) FROM "+s.n.messages+" WHERE published_at IS NULL GROUP BY topic ORDER BY topic"); err != nil {
			return err
		}
		perPart := map[int]int64{}
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var p int
			var n int64
			if err := rows.Scan(&p, &n); err != nil {
				return err
			}
			perPart[p] = n
			return nil
		}, "SELECT part, count(*) FROM "+s.n.messages+" FORCE INDEX (pending_idx) WHERE published_at IS NULL GROUP BY part"); err != nil {
			return err
		}
		held := map[string]int{}
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var (
				p     int
				owner sql.NullString
				epoch int64
				exp   sql.NullTime
			)
			if err := rows.Scan(&p, &owner, &epoch, &exp); err != nil {
				return err
			}
			ps := outbox.PartitionStatus{Partition: p, Outstanding: perPart[p], Epoch: epoch}
			if owner.Valid && exp.Valid && !exp.Time.Before(now.Time) {
				ps.Owner = owner.String
				ps.LeaseExpiresAt = exp.Time.UTC()
				held[ps.Owner]++
			}
			st.Partitions = append(st.Partitions, ps)
			return nil
		}, s.q.leases); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+s.n.deadLetters).Scan(&st.DeadLetters); err != nil {
			return err
		}
		return collect(ctx, tx, func(rows *sql.Rows) error {
			var rs outbox.RelayStatus
			if err := rows.Scan(&rs.Node, &rs.ExpiresAt); err != nil {
				return err
			}
			rs.ExpiresAt = rs.ExpiresAt.UTC()
			rs.Partitions = held[rs.Node]
			st.Relays = append(st.Relays, rs)
			return nil
		}, "SELECT node, expires_at FROM "+s.n.relays+" WHERE expires_at >= ? ORDER BY node", now.Time)
	})
	if err != nil {
		return nil, s.wrap("status", err)
	}
	return st, nil
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
		return nil, fmt.Errorf("mysql: backlog: limit must be between 1 and %d, got %d", outbox.BacklogScanLimitMax, limit)
	}
	b := &outbox.Backlog{Leases: map[string]int{}}
	var heads []outbox.TopicBacklog
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		if err := collect(ctx, tx, func(rows *sql.Rows) error {
			var (
				t      outbox.TopicBacklog
				topic  []byte
				oldest sql.NullTime
			)
			if err := rows.Scan(&topic, &t.Outstanding, &oldest); err != nil {
				return err
			}
			t.Topic = string(topic)
			t.OldestCreatedAt = fromNull(oldest)
			b.Outstanding += t.Outstanding
			b.Topics = append(b.Topics, t)
			return nil
		}, `SELECT topic, count(*), min(created_at) FROM (SELECT topic, created_at FROM `+s.n.messages+
			` WHERE published_at IS NULL LIMIT ?) w GROUP BY topic ORDER BY topic`, limit); err != nil {
			return err
		}
		p, err := readPartitions(ctx, tx, s.n)
		if err != nil {
			return err
		}
		// One index probe per partition: the head of each.
		for lo := 0; lo < p; lo += cursorsPerStatement {
			n := min(cursorsPerStatement, p-lo)
			args := make([]any, n)
			for i := range n {
				args[i] = lo + i
			}
			one := "(SELECT topic, created_at FROM " + s.n.messages + " FORCE INDEX (pending_idx) WHERE part = ? AND published_at IS NULL ORDER BY seq LIMIT 1)"
			if err := collect(ctx, tx, func(rows *sql.Rows) error {
				var (
					h     outbox.TopicBacklog
					topic []byte
				)
				if err := rows.Scan(&topic, &h.OldestCreatedAt); err != nil {
					return err
				}
				h.Topic = string(topic)
				h.OldestCreatedAt = h.OldestCreatedAt.UTC()
				heads = append(heads, h)
				return nil
			}, unionOf(one, n), args...); err != nil {
				return err
			}
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+s.n.deadLetters+` LIMIT ?) w`, limit).Scan(&b.DeadLetters); err != nil {
			return err
		}
		return s.readLeases(ctx, tx, b.Leases)
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
	if err := s.readTx(ctx, func(tx *sql.Tx) error { return s.readLeases(ctx, tx, leases) }); err != nil {
		return nil, s.wrap("leases", err)
	}
	return leases, nil
}

// readLeases adds to leases, per node whose heartbeat is live by the
// server's clock, the leases it holds unexpired (Leases and Backlog).
func (s *Store) readLeases(ctx context.Context, tx *sql.Tx, leases map[string]int) error {
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
    SELECT owner AS node, count(*) AS n FROM `+s.n.leases+` WHERE owner IS NOT NULL AND expires_at >= UTC_TIMESTAMP(6) GROUP BY owner
    UNION ALL
    SELECT node, 0 FROM `+s.n.relays+` WHERE expires_at >= UTC_TIMESTAMP(6)
) w GROUP BY node`)
}
