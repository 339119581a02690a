package outbox_test

import (
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/sidetest"
)

// The relay's guarantees (internal/sidetest) against the three capture
// sides on the in-memory stores: the poller and the claim on memstore, the
// stream on memstore.Stream (commit-ordered, settled as a confirmed prefix
// of transactions, read again past it when the last relay leaves).
// store/postgres runs the same suite on a real PostgreSQL.
var memSides = []sidetest.Side{
	{Name: "poller", Ordered: true, Open: func(t *testing.T) *sidetest.Outbox { return memSide(t, outbox.OrderingKey) }},
	{Name: "claim", Ordered: false, Open: func(t *testing.T) *sidetest.Outbox { return memSide(t, outbox.OrderingNone) }},
	{Name: "stream", Ordered: true, Open: memStreamSide},
}

func memSide(t *testing.T, ord outbox.Ordering) *sidetest.Outbox {
	st := memstore.New(16, nil)
	cfg := sidetest.Config("a")
	cfg.Ordering = ord
	return &sidetest.Outbox{
		Store: st, Config: cfg,
		Write:   func(msgs ...outbox.Message) error { return st.Write(t.Context(), msgs...) },
		Reopen:  func(*testing.T) outbox.Source { return st },
		Dead:    func() int64 { return int64(len(st.Dead())) },
		Pending: st.Outstanding,
	}
}

func memStreamSide(t *testing.T) *sidetest.Outbox {
	st := memstore.NewStream(16)
	t.Cleanup(func() {
		if n := st.ReadAgain(); n > 0 && !t.Failed() {
			t.Logf("stream: %d settled messages read again after the last relay left", n)
		}
	})
	return &sidetest.Outbox{
		Store: st, Config: sidetest.Config("a"),
		Write:   func(msgs ...outbox.Message) error { return st.Write(t.Context(), msgs...) },
		Reopen:  func(*testing.T) outbox.Source { return st },
		Dead:    func() int64 { return int64(len(st.Dead())) },
		Pending: st.Outstanding,
	}
}

func TestSidesBlockedDestinationPausesOnlyItself(t *testing.T) {
	t.Parallel()
	sidetest.BlockedDestinationPausesOnlyItself(t, memSides)
}

func TestSidesFailingKeyHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	sidetest.FailingKeyHoldsBackOnlyItself(t, memSides)
}

func TestSidesCleanStopRepublishesNothing(t *testing.T) {
	t.Parallel()
	sidetest.CleanStopRepublishesNothing(t, memSides)
}
