package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// ringRotateEnv sets the RingRotate of the crash test's relay processes.
const ringRotateEnv = "OUTBOX_E2E_RING_ROTATE"

// ringRotate is how often the ring tests' relays move the writers on:
// fast, so that children are truncated many times during a test.
const ringRotate = 100 * time.Millisecond

// ringRotateFromEnv returns the RingRotate given to a relay process (0:
// the default).
func ringRotateFromEnv() time.Duration {
	d, _ := time.ParseDuration(os.Getenv(ringRotateEnv))
	return d
}

// setupRing is setupWith on the ring layout of the outbox table.
func setupRing(t *testing.T, partitions int) *env {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	st, err := postgres.Open(ctx, dsn, postgres.Options{Partitions: partitions, Layout: postgres.LayoutRing, RingRotate: ringRotate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &env{dsn: dsn, store: st, target: natsTarget(t)}
}

// ringEmptyChildren counts the ring's children that are empty on disk now
// (truncated, or never written).
func ringEmptyChildren(t *testing.T, e *env) int {
	t.Helper()
	var n int
	err := e.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'outbox_messages'::regclass AND pg_relation_size(c.oid) = 0`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The chaos test of two relays on the ring layout, children truncated
// every few hundred milliseconds while they relay: nothing lost, per-key
// order, bounded duplicates.
func TestChaosTwoRelaysRing(t *testing.T) {
	e := setupRing(t, 32)
	chaosTwoRelays(t, e, 4000)
	t.Logf("ring: %d children empty at the end", ringEmptyChildren(t, e))
}

// The crash test on the ring layout: relay processes killed with SIGKILL
// while their keepers truncate children.
func TestCrashRestartRing(t *testing.T) {
	t.Setenv(ringRotateEnv, ringRotate.String())
	crashRestart(t, setupRing(t, 16))
}
