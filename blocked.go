package outbox

import "time"

// BlockedDestination is a destination (a topic) the relay paused because
// the broker refused it as a destination: no stream or topic for it, not
// authorised, unroutable, unreachable (see [BlockedError]).
type BlockedDestination struct {
	Topic string `json:"topic"`
	// Since is when the destination was first found blocked.
	Since time.Time `json:"since"`
	// LastError is the error of the last attempt or probe.
	LastError string `json:"last_error"`
}

// Blocked returns the destinations the relay holds paused now, in no
// particular order; none while every destination works. The relay does
// not pause destinations yet (every failure is retried per message), so it
// returns none. Safe for concurrent use.
func (r *Relay) Blocked() []BlockedDestination { return nil }
