package relaytest

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox"
)

// Start creates and starts a relay, stopped by t.Cleanup.
func Start(t testing.TB, st outbox.Source, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(st, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}
