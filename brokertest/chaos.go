package brokertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox"
)

// ErrInjected is wrapped by every failure a [Chaos] publisher makes up.
var ErrInjected = errors.New("brokertest: injected failure")

// Chaos is an [outbox.Publisher] that wraps another and misbehaves on
// purpose, for testing the relay. Per call it may:
//
//   - wait a random latency in [0, MaxLatency), honouring ctx;
//   - fail the whole batch before the inner publisher sees it
//     (BatchFailRate);
//   - fail single messages before the inner publisher sees them (FailRate):
//     those never reach the broker, and the rest of the batch is passed on;
//   - report a failure for messages the inner publisher acknowledged, as if
//     the acknowledgement had been lost (LostAckRate per message,
//     BatchLostAckRate per call): the broker has them, the relay is told they
//     failed, so it publishes them again, making duplicates.
//
// Injected errors wrap [ErrInjected] and are retryable, except that a
// fraction PermanentRate of the per-message failures before the broker are
// wrapped with [outbox.Permanent] (to exercise dead-lettering). Results of
// the inner publisher are returned unchanged unless a lost acknowledgement
// replaces them.
//
// Set the fields before the first Publish and do not change them after.
// Publish may be called concurrently. Randomness comes from Seed, so a
// single-goroutine run is reproducible.
type Chaos struct {
	Inner outbox.Publisher

	// FailRate is the probability that a message fails before reaching Inner.
	FailRate float64
	// BatchFailRate is the probability that a whole call fails before
	// reaching Inner.
	BatchFailRate float64
	// LostAckRate is the probability that a message Inner acknowledged is
	// reported as failed.
	LostAckRate float64
	// BatchLostAckRate is the probability that every message Inner
	// acknowledged in a call is reported as failed.
	BatchLostAckRate float64
	// PermanentRate is the fraction of FailRate's failures that are
	// permanent.
	PermanentRate float64
	// MaxLatency is the upper bound of the latency added before each call
	// (0: none).
	MaxLatency time.Duration
	// Seed seeds the random choices.
	Seed int64

	once  sync.Once
	mu    sync.Mutex
	rng   *rand.Rand
	stats chaosCounters
}

// ChaosStats counts what a [Chaos] publisher did.
type ChaosStats struct {
	Calls        int64 // Publish calls
	Messages     int64 // messages passed to Publish
	Forwarded    int64 // messages passed on to Inner
	FailedBefore int64 // messages failed before Inner (whole-batch failures included)
	Permanent    int64 // of FailedBefore, how many were permanent
	LostAcks     int64 // messages Inner acknowledged, reported as failed
}

type chaosCounters struct {
	calls, messages, forwarded, failedBefore, permanent, lostAcks atomic.Int64
}

// Stats returns the counters so far.
func (c *Chaos) Stats() ChaosStats {
	return ChaosStats{
		Calls:        c.stats.calls.Load(),
		Messages:     c.stats.messages.Load(),
		Forwarded:    c.stats.forwarded.Load(),
		FailedBefore: c.stats.failedBefore.Load(),
		Permanent:    c.stats.permanent.Load(),
		LostAcks:     c.stats.lostAcks.Load(),
	}
}

func (c *Chaos) init() {
	c.once.Do(func() {
		c.rng = rand.New(rand.NewPCG(uint64(c.Seed), 0x6f7574626f78))
	})
}

// draw returns true with probability p.
func (c *Chaos) draw(p float64) bool {
	if p <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64() < p
}

func (c *Chaos) latency() time.Duration {
	if c.MaxLatency <= 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Duration(c.rng.Int64N(int64(c.MaxLatency)))
}

// Publish implements [outbox.Publisher] with the misbehaviour described on
// [Chaos].
func (c *Chaos) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	c.init()
	c.stats.calls.Add(1)
	c.stats.messages.Add(int64(len(msgs)))
	if len(msgs) == 0 {
		return nil
	}
	if d := c.latency(); d > 0 {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			c.stats.failedBefore.Add(int64(len(msgs)))
			return outbox.FillErrors(len(msgs), fmt.Errorf("brokertest: chaos latency: %w", context.Cause(ctx)))
		}
	}
	if c.draw(c.BatchFailRate) {
		c.stats.failedBefore.Add(int64(len(msgs)))
		return outbox.FillErrors(len(msgs), fmt.Errorf("%w: whole batch of %d failed before reaching the broker", ErrInjected, len(msgs)))
	}

	errs := make([]error, len(msgs))
	forward := make([]*outbox.Message, 0, len(msgs))
	index := make([]int, 0, len(msgs)) // index in msgs of each forwarded message
	for i, m := range msgs {
		if !c.draw(c.FailRate) {
			forward = append(forward, m)
			index = append(index, i)
			continue
		}
		c.stats.failedBefore.Add(1)
		err := fmt.Errorf("%w: message %s failed before reaching the broker", ErrInjected, m.ID)
		if c.draw(c.PermanentRate) {
			c.stats.permanent.Add(1)
			err = outbox.Permanent(err)
		}
		errs[i] = err
	}
	if len(forward) == 0 {
		return errs
	}
	c.stats.forwarded.Add(int64(len(forward)))
	inner := c.Inner.Publish(ctx, forward)
	if len(inner) != len(forward) {
		err := fmt.Errorf("brokertest: chaos: inner publisher returned %d results for %d messages", len(inner), len(forward))
		for _, i := range index {
			errs[i] = err
		}
		return errs
	}
	lostBatch := c.draw(c.BatchLostAckRate)
	for j, i := range index {
		errs[i] = inner[j]
		if inner[j] == nil && (lostBatch || c.draw(c.LostAckRate)) {
			c.stats.lostAcks.Add(1)
			errs[i] = fmt.Errorf("%w: acknowledgement of message %s lost (the broker has it)", ErrInjected, msgs[i].ID)
		}
	}
	return errs
}

// Close closes Inner.
func (c *Chaos) Close() error { return c.Inner.Close() }
