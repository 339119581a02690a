package kafka

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: it asks the brokers for
// metadata (one request, to the first broker that answers, bounded by
// ctx) and returns nil if one answered, else the last error.
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(func() error {
		if err := p.client.Ping(ctx); err != nil {
			return fmt.Errorf("kafka: no broker of %v answers: %w", p.opts.Brokers, err)
		}
		return nil
	})
}
