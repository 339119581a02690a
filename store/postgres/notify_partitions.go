package postgres

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

var _ outbox.PartitionNotifier = (*Store)(nil)

// SubscribePartitions implements outbox.PartitionNotifier: it LISTENs on a
// connection taken out of the pool for good and calls fn with the
// partitions named by each notification Write sends (on commit). A payload
// it cannot read (another writer's, say) calls fn(nil): any partition. It
// returns nil when ctx ends or the Store closes, and the error when the
// connection fails; the connection is closed either way.
func (s *Store) SubscribePartitions(ctx context.Context, fn func(partitions []int)) error {
	if err := s.check("subscribe"); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closeCtx, cancel)
	defer stop()
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.wrap("subscribe", err)
	}
	conn := pc.Hijack()
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.n.channel}.Sanitize()); err != nil {
		return s.wrap("subscribe", err)
	}
	fn(nil) // subscribed: what committed before was not announced
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return s.wrap("subscribe", err)
		}
		fn(parsePartitions(n.Payload))
	}
}

// notifyAnyPartition is the payload of a write's notification when the
// list of its partitions would not fit in a NOTIFY payload (less than
// 8,000 bytes with PostgreSQL's default block size): "any partition".
const notifyAnyPartition = "*"

// parsePartitions reads a comma-separated list of partition numbers, or
// returns nil when the payload is not one.
func parsePartitions(payload string) []int {
	if payload == "" {
		return nil
	}
	fields := strings.Split(payload, ",")
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		p, err := strconv.Atoi(f)
		if err != nil || p < 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}
