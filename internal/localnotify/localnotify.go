// Package localnotify is the in-process notification of new writes shared
// by the stores without a database notification (SQLite, MySQL): a store's
// Write kicks it with the partitions written once the transaction
// commits, and the relays of the same process subscribe.
package localnotify

import (
	"context"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox"
)

// Broadcaster is the in-process notification of new writes of a store
// (SQLite, MySQL) whose writers and relays share a process. A Kick sends
// a value to every Subscribe channel without blocking, coalesced in a
// one-slot buffer, and adds the partitions written to every
// SubscribePartitions subscriber's pending set, coalesced until its
// callback takes them.
type Broadcaster struct {
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

// Kick notifies a write to parts; nil parts means any partition.
func (b *Broadcaster) Kick(parts []int) {
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

// Subscribe returns a channel that receives a value, coalesced, after each
// Kick, and is closed when ctx ends or the broadcaster closes.
func (b *Broadcaster) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, outbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.subs == nil {
		b.subs = make(map[chan struct{}]func() bool)
	}
	b.subs[ch] = context.AfterFunc(ctx, func() { b.remove(ch) })
	return ch, nil
}

func (b *Broadcaster) remove(ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[ch]; ok {
		delete(b.subs, ch)
		close(ch)
	}
}

// SubscribePartitions calls fn with the partitions of the writes notified
// until ctx ends or the broadcaster closes.
func (b *Broadcaster) SubscribePartitions(ctx context.Context, fn func([]int)) error {
	ps := &partSub{pending: make(map[int]struct{}), signal: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return outbox.ErrClosed
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

// Close ends every subscription; later subscriptions fail with
// outbox.ErrClosed.
func (b *Broadcaster) Close() {
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

// PartitionSubscribers returns how many SubscribePartitions calls are
// subscribed now.
func (b *Broadcaster) PartitionSubscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.psubs)
}
