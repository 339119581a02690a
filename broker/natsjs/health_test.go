package natsjs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestHealth: Health is nil while connected, an error naming the state
// while the server is down, nil once the client reconnected, and ErrClosed
// after Close.
func TestHealth(t *testing.T) {
	srv := testenv.StoppableNATS(t)
	p, err := natsjs.Dial(srv.URL(), natsjs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health while connected: %v", err)
	}
	srv.Stop()
	relaytest.WaitFor(t, "Health to report the outage", 30*time.Second, func() bool { return p.Health(ctx) != nil })
	t.Logf("down: %v", p.Health(ctx))
	srv.Start()
	relaytest.WaitFor(t, "Health to report the reconnection", 30*time.Second, func() bool { return p.Health(ctx) == nil })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}
