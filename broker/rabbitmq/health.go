package rabbitmq

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: nil while the connection to the
// broker is open and the broker does not block publishers (a memory or
// disk alarm). Without a connection it dials, as Publish does (no sooner
// than the reconnect backoff allows; ctx bounds the attempt), so that an
// idle Publisher still finds the broker back; until then it returns the
// reason.
func (p *Publisher) Health(ctx context.Context) error {
	// Close waits for it: no dial after Close.
	return p.gate.Run(func() error { return p.health(ctx) })
}

func (p *Publisher) health(ctx context.Context) error {
	if err := p.acquire(ctx); err != nil {
		return err
	}
	defer func() { <-p.lock }()
	s, err := p.connect(ctx)
	if err != nil {
		return err
	}
	if reason := s.blocked.Load(); reason != nil {
		return fmt.Errorf("rabbitmq: %s blocks publishers: %s", p.redacted, *reason)
	}
	return nil
}
