package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/outboxrelay/outbox"
)

func checkNode(op, node string, ttl time.Duration) error {
	if node == "" {
		return fmt.Errorf("mysql: %s: node is empty: give the relay a node name (outbox.Config.Node)", op)
	}
	if len(node) > 255 {
		return fmt.Errorf("mysql: %s: node name is %d bytes long; at most 255", op, len(node))
	}
	if ttl < time.Microsecond {
		return fmt.Errorf("mysql: %s: ttl must be at least 1µs, got %v", op, ttl)
	}
	return nil
}

// Heartbeat records that node is alive until now+ttl by the server's
// clock, forgets the nodes whose heartbeat expired, and returns how many
// nodes are alive, node included. Three statements, no transaction.
func (s *Store) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if err := s.check("heartbeat"); err != nil {
		return 0, err
	}
	if err := checkNode("heartbeat", node, ttl); err != nil {
		return 0, err
	}
	if _, err := s.db.ExecContext(ctx, s.q.expireNodes, node); err != nil {
		return 0, s.wrap("heartbeat", err)
	}
	if _, err := s.db.ExecContext(ctx, s.q.heartbeat, node, micros(ttl), micros(ttl)); err != nil {
		return 0, s.wrap("heartbeat", err)
	}
	var live int
	if err := s.db.QueryRowContext(ctx, s.q.countNodes, node).Scan(&live); err != nil {
		return 0, s.wrap("heartbeat", err)
	}
	return live, nil
}

// pairs returns "(?, ?), (?, ?)…" for leases and their arguments.
func pairs(leases []outbox.Lease) (string, []any) {
	args := make([]any, 0, 2*len(leases))
	b := make([]byte, 0, 8*len(leases))
	for i, l := range leases {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, "(?, ?)"...)
		args = append(args, l.Partition, l.Epoch)
	}
	return string(b), args
}

// AcquireLeases renews the leases of held that node still owns with the
// same epoch (even if expired: nobody else took them), then takes up to
// want partitions, lowest first, whose lease is free or expired (skipping
// rows another node is taking: SELECT … FOR UPDATE SKIP LOCKED),
// incrementing their epoch. Every returned lease expires at now+ttl by the
// server's clock; the result is sorted by partition. One transaction.
func (s *Store) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if err := s.check("acquire leases"); err != nil {
		return nil, err
	}
	if err := checkNode("acquire leases", node, ttl); err != nil {
		return nil, err
	}
	if want < 0 {
		return nil, fmt.Errorf("mysql: acquire leases: want must not be negative, got %d", want)
	}
	if len(held) > maxParams/2 {
		return nil, fmt.Errorf("mysql: acquire leases: %d held leases; at most %d", len(held), maxParams/2)
	}
	var got []outbox.Lease
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		got = got[:0]
		if len(held) > 0 {
			list, args := pairs(held)
			if _, err := tx.ExecContext(ctx, s.q.renewOf+list+")", append([]any{micros(ttl), node}, args...)...); err != nil {
				return err
			}
			rows, err := tx.QueryContext(ctx, s.q.heldOf+list+")", append([]any{node}, args...)...)
			if err != nil {
				return err
			}
			for rows.Next() {
				var l outbox.Lease
				if err := rows.Scan(&l.Partition, &l.Epoch); err != nil {
					rows.Close()
					return err
				}
				got = append(got, l)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		if want == 0 {
			return nil
		}
		rows, err := tx.QueryContext(ctx, s.q.free, want)
		if err != nil {
			return err
		}
		var free []any
		for rows.Next() {
			var p int
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return err
			}
			free = append(free, p)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(free) == 0 {
			return err
		}
		in := placeholders(len(free)) + ")"
		if _, err := tx.ExecContext(ctx, s.q.takeOf+in, append([]any{node, micros(ttl)}, free...)...); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, "SELECT part, epoch FROM "+s.n.leases+" WHERE part IN ("+in, free...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var l outbox.Lease
			if err := rows.Scan(&l.Partition, &l.Epoch); err != nil {
				return err
			}
			got = append(got, l)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.wrap("acquire leases", err)
	}
	slices.SortFunc(got, func(a, b outbox.Lease) int { return a.Partition - b.Partition })
	return got, nil
}

// ReleaseLeases hands back the leases node holds with those epochs, so that
// other nodes can take them at once. Leases no longer held are ignored.
func (s *Store) ReleaseLeases(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := s.check("release leases"); err != nil {
		return err
	}
	if len(leases) == 0 {
		return nil
	}
	return s.wrap("release leases", s.release(ctx, node, leases, false))
}

// Leave removes node's heartbeat and releases the leases node still holds
// with those epochs, in one transaction.
func (s *Store) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := s.check("leave"); err != nil {
		return err
	}
	return s.wrap("leave", s.release(ctx, node, leases, true))
}

func (s *Store) release(ctx context.Context, node string, leases []outbox.Lease, leave bool) error {
	for len(leases) > 0 || leave {
		n := min(len(leases), maxParams/2)
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			if n > 0 {
				list, args := pairs(leases[:n])
				if _, err := tx.ExecContext(ctx, "UPDATE "+s.n.leases+" SET owner = NULL, expires_at = NULL WHERE owner = ? AND (part, epoch) IN ("+list+")",
					append([]any{node}, args...)...); err != nil {
					return err
				}
			}
			if leave && n == len(leases) {
				_, err := tx.ExecContext(ctx, s.q.leaveNode, node)
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n == len(leases) {
			return nil
		}
		leases = leases[n:]
	}
	return nil
}
