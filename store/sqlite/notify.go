package sqlite

import (
	"context"
	"fmt"
	"sync"

	"github.com/outboxrelay/outbox"
)

// broadcaster is the in-process notification of new writes: a kick sends a
// value to every subscriber without blocking, coalesced in a one-slot
// buffer.
type broadcaster struct {
	mu     sync.Mutex
	subs   map[chan struct{}]func() bool // channel → stop of its context.AfterFunc
	closed bool
}

func (b *broadcaster) kick() {
	b.mu.Lock()
	for ch := range b.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	b.mu.Unlock()
}

func (b *broadcaster) subscribe(ctx context.Context) (<-chan struct{}, error) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("sqlite: subscribe: %w", outbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: subscribe: %w", err)
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

func (b *broadcaster) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for ch, stop := range b.subs {
		stop()
		close(ch)
	}
	clear(b.subs)
}

// Subscribe implements outbox.Notifier for writes made in this process: the
// returned channel receives a value, coalesced, when messages may have been
// written. The channel is closed when ctx ends or the store is closed.
//
// On a database opened by [Open], the signal is sent after the commit of
// any transaction in which [Store.Write] or the package-level [Write] ran on
// that database, so the messages are visible when it arrives. On a store
// made by [New], [Store.Write] sends it when it inserts, before the caller
// commits; a relay that looks too early finds nothing and sees the messages
// at its next poll. Writes by other processes, or through other *sql.DB
// handles, send nothing: the relay's polling finds them.
func (s *Store) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	return s.bc.subscribe(ctx)
}
