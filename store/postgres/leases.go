package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

// interval encodes d as a PostgreSQL interval parameter (microseconds).
func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// Partitions returns P from the meta table, read once and then cached (P
// never changes). The relay calls it when it starts, and this first read
// fails with [ErrStandby] on a hot standby: a relay needs the primary.
func (s *Store) Partitions(ctx context.Context) (int, error) {
	if p := s.partitions.Load(); p > 0 {
		return int(p), nil
	}
	if err := s.check("partitions"); err != nil {
		return 0, err
	}
	var (
		p       int
		standby bool
		ring    bool
	)
	err := s.pool.QueryRow(ctx, s.q.partitions).Scan(&p, &standby, &ring)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("postgres: partitions: the meta table %s is empty: run `outbox migrate --store <url>` (or Store.Migrate)", s.n.meta)
	}
	if err != nil {
		return 0, s.wrap("partitions", err)
	}
	if standby {
		return 0, fmt.Errorf("postgres: partitions: %w", ErrStandby)
	}
	s.ringLayout.Store(ring)
	s.partitions.Store(int64(p))
	return p, nil
}

// Heartbeat records node as alive until now+ttl by the database clock,
// forgets expired nodes, and returns how many nodes are alive. At most
// every HorizonSampleInterval, when the store has a logger (SetLogger), it
// also reads the xmin horizon and warns when it is held (see
// [Store.XminHorizon]); that read's failure is logged, not returned.
func (s *Store) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if err := s.check("heartbeat"); err != nil {
		return 0, err
	}
	if err := checkNode(node, ttl); err != nil {
		return 0, err
	}
	var live int
	if err := s.pool.QueryRow(ctx, s.q.heartbeat, node, interval(ttl)).Scan(&live); err != nil {
		return 0, s.wrap("heartbeat", err)
	}
	s.sampleHorizon(ctx)
	s.startRingKeeper()
	return live, nil
}

// AcquireLeases renews the leases of held that node still owns with the same
// epoch and takes up to want free or expired partitions (epoch + 1), in one
// statement. Expiry is judged and set by the database clock. The result, in
// partition order, holds exactly the renewed and the newly taken leases.
func (s *Store) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if err := s.check("acquire leases"); err != nil {
		return nil, err
	}
	if err := checkNode(node, ttl); err != nil {
		return nil, err
	}
	parts, epochs := leaseArrays(held)
	rows, err := s.pool.Query(ctx, s.q.acquire, node, parts, epochs, interval(ttl), max(want, 0))
	if err != nil {
		return nil, s.wrap("acquire leases", err)
	}
	leases, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.Lease, error) {
		var l outbox.Lease
		err := row.Scan(&l.Partition, &l.Epoch)
		return l, err
	})
	if err != nil {
		return nil, s.wrap("acquire leases", err)
	}
	return leases, nil
}

// ReleaseLeases frees the leases node holds with those epochs; others are
// ignored. The epochs stay, so the next owner's epoch is higher.
func (s *Store) ReleaseLeases(ctx context.Context, node string, leases []outbox.Lease) error {
	if len(leases) == 0 {
		return nil
	}
	if err := s.check("release leases"); err != nil {
		return err
	}
	parts, epochs := leaseArrays(leases)
	if _, err := s.pool.Exec(ctx, s.q.release, node, parts, epochs); err != nil {
		return s.wrap("release leases", err)
	}
	return nil
}

// Leave removes node's heartbeat and frees the leases node still holds
// with those epochs, in one statement.
func (s *Store) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := s.check("leave"); err != nil {
		return err
	}
	parts, epochs := leaseArrays(leases)
	if _, err := s.pool.Exec(ctx, s.q.leave, node, parts, epochs); err != nil {
		return s.wrap("leave", err)
	}
	return nil
}

func leaseArrays(leases []outbox.Lease) ([]int32, []int64) {
	parts := make([]int32, len(leases))
	epochs := make([]int64, len(leases))
	for i, l := range leases {
		parts[i] = int32(l.Partition)
		epochs[i] = l.Epoch
	}
	return parts, epochs
}

func checkNode(node string, ttl time.Duration) error {
	if node == "" {
		return errors.New("postgres: the relay node name is empty")
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("postgres: the lease/heartbeat ttl must be at least 1ms, got %v", ttl)
	}
	return nil
}
