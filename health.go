package outbox

import "context"

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
