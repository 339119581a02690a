package mysql

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox"
)

var _ outbox.PartitionNotifier = (*Store)(nil)

// broadcaster is the in-process notification of new writes. A kick sends
// a value to every Subscribe channel without blocking, coalesced in a
// one-slot buffer, and adds the partitions written to every
// SubscribePartitions subscriber's pending set, coalesced until its
// callback takes them.
type broadcaster struct {
	mu     sync.Mutex
	subs   map[chan struct{}]func() bool // channel → stop of its context.AfterFunc
	psubs  map[*partSub]struct{}
	closed bool
	done   chan struct{} // closed by close
}

// partSub is one SubscribePartitions subscriber.
type partSub struct {
	mu      sync.Mutex
	pending map[int]struct{}
	any     bool          // a write of unknown partitions
	signal  chan struct{} // one slot: pending is not empty
}

// kick notifies a write to parts; nil parts means any partition.
func (b *broadcaster) kick(parts []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	for ps := range b.psubs {
		ps.add(parts)
	}
}

func (ps *partSub) add(parts []int) {
	ps.mu.Lock()
	if parts == nil {
		ps.any = true
	} else if !ps.any {
		for _, p := range parts {
			ps.pending[p] = struct{}{}
		}
	}
	ps.mu.Unlock()
	select {
	case ps.signal <- struct{}{}:
	default:
	}
}

// take returns and clears the pending partitions, sorted; nil means any.
func (ps *partSub) take() []int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.any {
		ps.any = false
		clear(ps.pending)
		return nil
	}
	out := make([]int, 0, len(ps.pending))
	for p := range ps.pending {
		out = append(out, p)
	}
	clear(ps.pending)
	slices.Sort(out)
	return out
}

func (b *broadcaster) subscribe(ctx context.Context) (<-chan struct{}, error) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("mysql: subscribe: %w", outbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mysql: subscribe: %w", err)
	}
	if b.subs == nil {
		b.subs = make(map[chan struct{}]func() bool)
	}
	b.subs[ch] = context.AfterFunc(ctx, func() { b.remove(ch) })
	return ch, nil
}

func (b *broadcaster) remove(ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[ch]; ok {
		delete(b.subs, ch)
		close(ch)
	}
}

// subscribePartitions calls fn with the partitions of the writes notified
// until ctx ends or the broadcaster closes.
func (b *broadcaster) subscribePartitions(ctx context.Context, fn func([]int)) error {
	ps := &partSub{pending: make(map[int]struct{}), signal: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("mysql: subscribe: %w", outbox.ErrClosed)
	}
	if b.psubs == nil {
		b.psubs = make(map[*partSub]struct{})
	}
	if b.done == nil {
		b.done = make(chan struct{})
	}
	b.psubs[ps] = struct{}{}
	done := b.done
	b.mu.Unlock()
	// Subscribed: what committed before was not announced, so the first
	// call says "any partition".
	ps.add(nil)
	defer func() {
		b.mu.Lock()
		delete(b.psubs, ps)
		b.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case <-ps.signal:
			fn(ps.take())
		}
	}
}

func (b *broadcaster) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for ch, stop := range b.subs {
		stop()
		close(ch)
	}
	clear(b.subs)
	if b.done == nil {
		b.done = make(chan struct{})
	}
	close(b.done)
}

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
	return s.bc.subscribe(ctx)
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
	return s.bc.subscribePartitions(ctx, fn)
}
