package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxrelay/outbox"
)

func checkNode(op, node string, ttl time.Duration) error {
	if node == "" {
		return fmt.Errorf("sqlite: %s: node is empty: give the relay a node name (outbox.Config.Node)", op)
	}
	if ttl <= 0 {
		return fmt.Errorf("sqlite: %s: ttl must be positive, got %v", op, ttl)
	}
	return nil
}

// Heartbeat records that node is alive until now+ttl by the store's clock,
// forgets the nodes whose heartbeat expired, and returns how many nodes are
// alive, node included.
func (s *Store) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if err := s.check("heartbeat"); err != nil {
		return 0, err
	}
	if err := checkNode("heartbeat", node, ttl); err != nil {
		return 0, err
	}
	var live int
	err := s.inTx(ctx, func(c *sql.Conn) error {
		now := s.now()
		if _, err := c.ExecContext(ctx, s.q.expireNodes, nanos(now), node); err != nil {
			return err
		}
		if _, err := c.ExecContext(ctx, s.q.heartbeat, node, nanos(now.Add(ttl)), nanos(now)); err != nil {
			return err
		}
		return c.QueryRowContext(ctx, s.q.countNodes).Scan(&live)
	})
	if err != nil {
		return 0, s.wrap("heartbeat", err)
	}
	return live, nil
}

// leaseRow is one row of the leases table.
type leaseRow struct {
	partition int
	owner     sql.NullString
	epoch     int64
	expiresAt sql.NullInt64
}

// AcquireLeases renews the leases of held that node still owns with the same
// epoch (even if expired: nobody else took them, so nothing was settled
// under another epoch), then takes up to want partitions, lowest first,
// whose lease is free or expired, incrementing their epoch. Every returned lease expires at now+ttl by the
// store's clock; the result is sorted by partition.
func (s *Store) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if err := s.check("acquire leases"); err != nil {
		return nil, err
	}
	if err := checkNode("acquire leases", node, ttl); err != nil {
		return nil, err
	}
	if want < 0 {
		return nil, fmt.Errorf("sqlite: acquire leases: want must not be negative, got %d", want)
	}
	var got []outbox.Lease
	err := s.inTx(ctx, func(c *sql.Conn) error {
		got = got[:0]
		now := s.now()
		exp := nanos(now.Add(ttl))
		kept := make(map[int]bool, len(held))
		for _, l := range held {
			res, err := c.ExecContext(ctx, s.q.renewLease, exp, l.Partition, node, l.Epoch)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 1 && !kept[l.Partition] {
				kept[l.Partition] = true
				got = append(got, l)
			}
		}
		if want == 0 {
			return nil
		}
		rows, err := c.QueryContext(ctx, s.q.leases)
		if err != nil {
			return err
		}
		var free []leaseRow
		for rows.Next() {
			var r leaseRow
			if err := rows.Scan(&r.partition, &r.owner, &r.epoch, &r.expiresAt); err != nil {
				rows.Close()
				return err
			}
			switch {
			case kept[r.partition]:
			case !r.owner.Valid, !r.expiresAt.Valid, r.expiresAt.Int64 < nanos(now):
				free = append(free, r)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, r := range free[:min(want, len(free))] {
			var epoch int64
			if err := c.QueryRowContext(ctx, s.q.takeLease, node, exp, r.partition, r.epoch).Scan(&epoch); err != nil {
				return err
			}
			got = append(got, outbox.Lease{Partition: r.partition, Epoch: epoch})
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			err = errors.New("a lease row changed during the transaction") // cannot happen: the transaction holds the write lock
		}
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
	err := s.inTx(ctx, func(c *sql.Conn) error {
		for _, l := range leases {
			if _, err := c.ExecContext(ctx, s.q.release, l.Partition, node, l.Epoch); err != nil {
				return err
			}
		}
		return nil
	})
	return s.wrap("release leases", err)
}

// Leave removes node's heartbeat and releases the leases node still holds
// with those epochs, in one transaction.
func (s *Store) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := s.check("leave"); err != nil {
		return err
	}
	err := s.inTx(ctx, func(c *sql.Conn) error {
		for _, l := range leases {
			if _, err := c.ExecContext(ctx, s.q.release, l.Partition, node, l.Epoch); err != nil {
				return err
			}
		}
		_, err := c.ExecContext(ctx, s.q.leaveNode, node)
		return err
	})
	return s.wrap("leave", err)
}
