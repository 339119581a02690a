package postgres

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/sidetest"
)

// The relay's guarantees (internal/sidetest), each tried against the three
// capture sides that feed its publishing pipeline, on a real PostgreSQL:
// the partition-lease poller (table capture, ordering key), the SKIP LOCKED
// claim (table capture, ordering none) and the stream (WAL capture). The
// root package runs the same suite on the in-memory stores.

var captureSides = []sidetest.Side{
	{Name: "poller", Ordered: true, Open: func(t *testing.T) *sidetest.Outbox { return tableSide(t, outbox.OrderingKey) }},
	{Name: "claim", Ordered: false, Open: func(t *testing.T) *sidetest.Outbox { return tableSide(t, outbox.OrderingNone) }},
	{Name: "stream", Ordered: true, Open: streamSide},
}

func tableSide(t *testing.T, ord outbox.Ordering) *sidetest.Outbox {
	b := setup(t)
	cfg := sidetest.Config("a")
	cfg.Ordering = ord
	return &sidetest.Outbox{
		Store: b.store, Config: cfg,
		Write: func(msgs ...outbox.Message) error { return b.write(t, msgs...) },
		Reopen: func(t *testing.T) outbox.Source {
			s, err := Open(b.ctx, b.dsn, b.opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Dead:    func() int64 { return int64(b.count(t, "_dead_letters")) },
		Pending: func() int { return b.count(t, "_messages") },
	}
}

func streamSide(t *testing.T) *sidetest.Outbox {
	// A buffer smaller than the tests' backlogs: what fills it is parked.
	b := setupWAL(t, Options{WAL: WALOptions{BufferMessages: 100, ParkAfter: 100 * time.Millisecond}})
	return &sidetest.Outbox{
		Store: b.store, Config: sidetest.Config("a"),
		Write: func(msgs ...outbox.Message) error { return b.write(b.ctx, msgs...) },
		Reopen: func(t *testing.T) outbox.Source {
			s, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Dead: func() int64 {
			n, err := b.store.CountDeadLetters(b.ctx, outbox.DeadLetterFilter{})
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
		Pending: func() int { return -1 },
	}
}

func TestSidesBlockedDestinationPausesOnlyItself(t *testing.T) {
	t.Parallel()
	sidetest.BlockedDestinationPausesOnlyItself(t, captureSides)
}

func TestSidesFailingKeyHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	sidetest.FailingKeyHoldsBackOnlyItself(t, captureSides)
}

func TestSidesCleanStopRepublishesNothing(t *testing.T) {
	t.Parallel()
	sidetest.CleanStopRepublishesNothing(t, captureSides)
}
