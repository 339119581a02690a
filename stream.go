package outbox

import (
	"context"
	"fmt"
	"time"
)

// The stream coordinator: with a StreamStore there are no leases to share.
// The relay of the process holding the stream owns every partition, under
// the hold's epoch; a relay that does not hold it owns none and stands by
// (the store keeps trying to take the stream). The coordinator asks for
// the stream every HeartbeatInterval, and at once when the store says its
// answer changed (taken over, lost), so that a standby publishes as soon
// as its store streams.

// streamRound asks for the stream and gives the workers every partition
// under the hold's epoch, or none. Cut off from the broker, the relay
// starts nothing new (its partitions are marked shed), and releases the
// stream once what is in flight is settled (applyReports), so that a relay
// of another process that can publish takes it; it does not ask for it
// again until the broker is back. Shutting down, it only keeps what it
// holds: Leave releases the stream at the end.
func (c *coordinator) streamRound(ctx context.Context, shuttingDown, cutOff bool) (<-chan struct{}, error) {
	r := c.r
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.HeartbeatInterval, r.cfg.LeaseTTL/3))
	defer cancel()
	start := time.Now()
	holding := len(c.leases) > 0
	var (
		epoch   int64
		changed <-chan struct{}
	)
	if holding || !(cutOff || shuttingDown) {
		var err error
		if epoch, changed, err = r.caps.stream.Hold(ctx, r.cfg.Node); err != nil {
			return nil, fmt.Errorf("hold the stream: %w", err)
		}
		c.streamAsked = true
	} else if cutOff && c.streamAsked {
		// A standby cut off from the broker stops trying to take it.
		if err := c.releaseStream(ctx, 0); err != nil {
			return nil, err
		}
	}
	validUntil := start.Add(r.cfg.LeaseTTL - r.cfg.PublishTimeout)
	next := make(map[int]*heldLease, r.partitions)
	if epoch != 0 {
		for p := range r.partitions {
			old, ok := c.leases[p]
			if cutOff && (!ok || old.Epoch != epoch) {
				continue // handed back already, or never held: take nothing new
			}
			next[p] = &heldLease{Lease: Lease{Partition: p, Epoch: epoch}, validUntil: validUntil, shed: cutOff}
		}
	}
	changedSet := len(next) != len(c.leases)
	for p, h := range next {
		if old, ok := c.leases[p]; !ok || old.Epoch != h.Epoch || old.shed != h.shed {
			changedSet = true
		}
	}
	c.leases = next
	c.sendLeases() // validity changed at least
	if changedSet {
		r.log.Info("stream", "held", epoch != 0 && !cutOff, "epoch", epoch, "partitions", len(next), "handing_back", cutOff && len(next) > 0)
	}
	r.nLeases.Store(int64(len(next)))
	r.emit(Event{Kind: EventLeases, Count: len(next)})
	r.beat()
	c.applyReportsOrLog(ctx)
	if holding && len(c.leases) == 0 && cutOff {
		// Everything handed back was drained between two rounds.
		if err := c.releaseStream(ctx, 0); err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// releaseStream gives the stream up once the relay holds no partition of
// it (held, the partitions still held, is 0): every partition being handed
// back is drained.
func (c *coordinator) releaseStream(ctx context.Context, held int) error {
	r := c.r
	if held > 0 || !c.streamAsked {
		return nil
	}
	if err := r.caps.stream.Release(ctx, r.cfg.Node); err != nil {
		return fmt.Errorf("release the stream: %w", err)
	}
	c.streamAsked = false
	r.log.Info("released the stream for a relay that can publish")
	return nil
}
