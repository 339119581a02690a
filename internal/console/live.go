package console

import (
	"time"

	"github.com/outboxrelay/outbox"
)

// Live is the state that only a relay running in this process knows. The
// overview samples Stats every second for its throughput chart.
type Live interface {
	// Node is the relay's name in leases and status.
	Node() string
	// Stats returns the relay's running totals.
	Stats() outbox.Stats
	// Ready reports whether the relay runs and reaches its store.
	Ready() bool
}

// BlockedReporter is implemented by a [Live] source whose relay pauses
// destinations that cannot take messages (no stream or topic, not
// authorised, broker unreachable). Without it the overview says that this
// relay does not report blocked destinations.
type BlockedReporter interface {
	BlockedDestinations() []BlockedDestination
}

// BlockedDestination is a destination a relay has paused.
type BlockedDestination struct {
	// Destination is the topic (or broker-side name) that is blocked.
	Destination string `json:"destination"`
	// Reason is the broker's error.
	Reason string `json:"reason"`
	// Since is when it was blocked; NextProbe when the relay tries again.
	Since     time.Time `json:"since,omitzero"`
	NextProbe time.Time `json:"next_probe,omitzero"`
	// Waiting counts the messages held back, when the relay or the
	// store's topic counts tell (WaitingKnown).
	Waiting      int64 `json:"waiting,omitempty"`
	WaitingKnown bool  `json:"waiting_known"`
}

// relayLive adapts an *outbox.Relay.
type relayLive struct{ r *outbox.Relay }

// RelayLive returns the Live source of a relay of this process, blocked
// destinations included.
func RelayLive(r *outbox.Relay) Live { return relayLive{r} }

// BlockedDestinations passes on the relay's paused destinations.
func (l relayLive) BlockedDestinations() []BlockedDestination {
	bl := l.r.Blocked()
	out := make([]BlockedDestination, len(bl))
	for i, b := range bl {
		out[i] = BlockedDestination{Destination: b.Destination, Reason: b.LastError, Since: b.Since, NextProbe: b.NextProbe}
	}
	return out
}

func (l relayLive) Node() string        { return l.r.Config().Node }
func (l relayLive) Stats() outbox.Stats { return l.r.Stats() }
func (l relayLive) Ready() bool         { return l.r.Ready() }
