package mysql

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var _ outbox.PartitionNotifier = (*Store)(nil)

// Subscribe signals writes made in this process (the relay uses
// SubscribePartitions, which names their partitions): the
// returned channel receives a value, coalesced, when messages may have been
// written. The channel is closed when ctx ends or the store is closed.
//
// On a database opened by [Open], the signal is sent after the commit of
// any transaction in which [Store.Write] ran on
// that database, so the messages are visible when it arrives. On a store
// made by [New], [Store.Write] sends it when it inserts, before the caller
// commits; a relay that looks too early finds nothing and sees the messages
// at its next poll. Writes by other processes, or through other *sql.DB
// handles, send nothing: the relay's polling finds them.
func (s *Store) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	ch, err := s.bc.Subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("mysql: subscribe: %w", err)
	}
	return ch, nil
}

// SubscribePartitions implements outbox.PartitionNotifier, which the relay
// prefers to Subscribe: it calls fn, from one goroutine, with the
// partitions written by the transactions notified as for Subscribe, so
// that the relay wakes only the workers owning them and they fetch only
// those partitions. Its first call, once subscribed, is fn(nil) (any
// partition: what committed before was not announced), as are calls after
// a requeue of dead letters. Writes committed while fn runs are passed
// together to its next call. It returns nil when ctx ends or the store is
// closed.
func (s *Store) SubscribePartitions(ctx context.Context, fn func(partitions []int)) error {
	if err := s.check("subscribe"); err != nil {
		return err
	}
	if err := s.bc.SubscribePartitions(ctx, fn); err != nil {
		return fmt.Errorf("mysql: subscribe: %w", err)
	}
	return nil
}
