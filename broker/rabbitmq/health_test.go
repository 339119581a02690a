package rabbitmq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestHealth: Health is nil while connected; an error while a memory alarm
// blocks publishers; nil again once it clears; nil after the broker closed
// the connection (Health dials again, so an idle publisher finds the
// broker back); ErrClosed after Close. Not parallel: it sets an alarm on
// the shared node.
func TestHealth(t *testing.T) {
	p := dial(t, rabbitmq.Options{Channels: 1})
	topic := "rmq." + testenv.Name(t)
	queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	publishAll(t, p, newMessage(topic, "", "before the alarm"))
	ctx := context.Background()
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health while connected: %v", err)
	}

	restore := memoryAlarm(t)
	relaytest.WaitFor(t, "Health to report the alarm", 30*time.Second, func() bool {
		// The broker tells a connection it is blocked once it publishes.
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		p.Publish(short, []*outbox.Message{newMessage(topic, "", "during the alarm")})
		cancel()
		err := p.Health(ctx)
		return err != nil && strings.Contains(err.Error(), "blocks publishers")
	})
	restore()
	relaytest.WaitFor(t, "Health after the alarm", 30*time.Second, func() bool { return p.Health(ctx) == nil })

	testenv.RabbitMQCtl(t, "close_all_connections", "health test")
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health after the broker closed the connection: %v, want nil (it dials again)", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}
