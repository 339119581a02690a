package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// TestRelayRefusesStandby: a relay connected to a hot standby must not
// run: marks (snapshots) taken there miss transactions in progress on the
// primary, so late commits would be skipped, and leases cannot be written.
// Its Start fails with an error that says so. The same relay on the
// primary starts.
func TestRelayRefusesStandby(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, stopPrimary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPrimary() })
	onPrimary, err := postgres.Open(ctx, primary, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer onPrimary.Close()
	if err := onPrimary.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	standby, stopStandby, err := testenv.StartPostgresStandby(ctx, primary, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopStandby() })
	onStandby, err := postgres.Open(ctx, standby, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer onStandby.Close()

	r, err := outbox.NewRelay(onStandby, &relaytest.Recorder{}, outbox.Config{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(ctx)
	if err == nil {
		r.Stop()
		t.Fatal("a relay started on a hot standby")
	}
	if !errors.Is(err, postgres.ErrStandby) || !strings.Contains(err.Error(), "primary") {
		t.Fatalf("Start on a standby: %v; want postgres.ErrStandby, saying to use the primary", err)
	}
	// Leases cannot be written there either, and the error says why.
	_, err = onStandby.AcquireLeases(ctx, "n", nil, 1, time.Minute)
	if !errors.Is(err, postgres.ErrStandby) {
		t.Fatalf("AcquireLeases on a standby: %v; want postgres.ErrStandby", err)
	}

	r, err = outbox.NewRelay(onPrimary, &relaytest.Recorder{}, outbox.Config{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start on the primary: %v", err)
	}
	r.Stop()
}
