package redis

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: it sends PING (bounded by ctx,
// or PublishTimeout if ctx has no deadline) and returns nil if the server
// answered.
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(func() error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, p.opts.PublishTimeout)
			defer cancel()
		}
		if err := p.client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: server %s does not answer PING: %w", p.opts.Addr, err)
		}
		return nil
	})
}
