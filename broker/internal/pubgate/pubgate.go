// Package pubgate is the portable part of the publishers under broker/:
// what each does the same way around its Publish calls, whatever the
// broker. A [Gate] refuses calls once its publisher is closed, counts the
// calls in progress so that Close can wait for them, refuses a call whose
// context has already ended, and gives a call whose context has no deadline
// the publisher's default one. Each publisher keeps only what is its
// broker's own: building the broker's messages, sending them, and awaiting
// the acknowledgements.
package pubgate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// Config names the publisher and its default deadline, for the errors a
// Gate returns.
type Config struct {
	// Name starts every error: "kafka", "natsjs", "rabbitmq".
	Name string
	// Timeout is the deadline of a call whose context has none.
	Timeout time.Duration
	// TimeoutField is the option that sets Timeout, such as
	// "PublishTimeout".
	TimeoutField string
	// Awaited is what the call waits for from the broker, such as
	// "acknowledgement" or "confirm".
	Awaited string
}

// Gate guards the Publish calls of one publisher. Create it with [New].
// It is safe for concurrent use.
type Gate struct {
	name    string
	timeout time.Duration
	cause   error // why a call past its default deadline ended

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup // calls in progress
}

// New returns an open Gate.
func New(c Config) *Gate {
	return &Gate{
		name:    c.Name,
		timeout: c.Timeout,
		cause: fmt.Errorf("%s: no %s within %s (%v): %w",
			c.Name, c.Awaited, c.TimeoutField, c.Timeout, context.DeadlineExceeded),
	}
}

// Do runs publish, the broker's own part of a Publish call of n messages,
// and returns the call's n results, which publish fills in. publish gets
// the call's context: ctx, with the default deadline if ctx has none. Do
// does not run publish when n is 0, when the Gate is closed (every result
// wraps [outbox.ErrClosed]), or when ctx has ended already (every result
// wraps ctx's cause).
func (g *Gate) Do(ctx context.Context, n int, publish func(ctx context.Context, errs []error)) []error {
	if n == 0 {
		return []error{}
	}
	if !g.begin() {
		return outbox.FillErrors(n, fmt.Errorf("%s: publish: %w", g.name, outbox.ErrClosed))
	}
	defer g.active.Done()
	if ctx.Err() != nil {
		return outbox.FillErrors(n, fmt.Errorf("%s: publish: not sent: %w", g.name, context.Cause(ctx)))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, g.timeout, g.cause)
		defer cancel()
	}
	errs := make([]error, n)
	publish(ctx, errs)
	return errs
}

// Run runs call, another call Close waits for (a health check), and returns
// its error; once the Gate is closed, it returns an error wrapping
// [outbox.ErrClosed] instead.
func (g *Gate) Run(call func() error) error {
	if !g.begin() {
		return fmt.Errorf("%s: %w", g.name, outbox.ErrClosed)
	}
	defer g.active.Done()
	return call()
}

// begin registers a call, unless the Gate is closed.
func (g *Gate) begin() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.active.Add(1)
	return true
}

// Close makes later calls fail with [outbox.ErrClosed] and waits for the
// calls in progress to return. It reports whether this was the first
// Close: only then does the publisher release what it holds.
func (g *Gate) Close() bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.closed = true
	g.mu.Unlock()
	g.active.Wait()
	return true
}
