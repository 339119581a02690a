package natsjs

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: nil while the NATS connection
// is connected, else an error naming its state (reconnecting,
// disconnected, closed) and its last error. It reads the connection's
// state and sends nothing.
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(p.health)
}

func (p *Publisher) health() error {
	nc := p.nc
	if nc == nil {
		nc = p.js.Conn()
	}
	st := nc.Status()
	if st == nats.CONNECTED {
		return nil
	}
	err := fmt.Errorf("natsjs: not connected to NATS (%s)", strings.ToLower(st.String()))
	if last := nc.LastError(); last != nil {
		err = fmt.Errorf("%w: %v", err, last)
	}
	return err
}
