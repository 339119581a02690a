package outbox

import (
	"context"
	"time"
)

// HealthChecker is implemented by publishers that can tell whether their
// broker is reachable: the natsjs, rabbitmq and kafka publishers. Health
// returns nil while the publisher is connected (or could connect), else an
// error saying what is wrong. It is bounded by ctx, safe for concurrent
// use, and cheap enough for a readiness probe: it reads the connection's
// state, or sends one request at most. The relay uses it to hand its
// partitions back when it is cut off from the broker for a lease TTL.
type HealthChecker interface {
	Health(ctx context.Context) error
}

// LastStoreContact returns when the relay's last successful store round
// trip (a heartbeat or a claim) ended; zero before the first one. [Relay.Ready]
// is based on it.
func (r *Relay) LastStoreContact() time.Time {
	if ns := r.lastBeat.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Running reports whether the relay was started and has not stopped.
func (r *Relay) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state == 1 && !closed(r.done)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
