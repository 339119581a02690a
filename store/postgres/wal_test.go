package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/storetest"
)

// walBundle is a fresh WAL-capture store, migrated, in its own database.
type walBundle struct {
	ctx   context.Context
	dsn   string
	store *WALStore
}

// walTestOptions are quick to react: tests wait on conditions, and short
// intervals make them come sooner.
func walTestOptions(t *testing.T, o Options) Options {
	if o.Schema == "" {
		o.Schema = testenv.Name(t)
	}
	if o.Partitions == 0 {
		o.Partitions = testPartitions
	}
	if o.WAL.StatusInterval == 0 {
		o.WAL.StatusInterval = 20 * time.Millisecond
	}
	if o.WAL.RetryInterval == 0 {
		o.WAL.RetryInterval = 50 * time.Millisecond
	}
	return o
}

// setupWAL opens and migrates a WAL store on a new database (or dsn).
func setupWAL(t *testing.T, o Options, dsn ...string) *walBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var d string
	if len(dsn) > 0 {
		d = dsn[0]
	} else {
		d = testenv.PostgresDSN(t)
	}
	s, err := OpenWAL(ctx, d, walTestOptions(t, o))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &walBundle{ctx: ctx, dsn: d, store: s}
}

// streaming starts the reader and waits until it holds the slot.
func (b *walBundle) streaming(t *testing.T) {
	t.Helper()
	b.store.Start()
	if err := b.store.WaitStreaming(b.ctx); err != nil {
		t.Fatal(err)
	}
}

// write commits msgs in one transaction with the WAL writer.
func (b *walBundle) write(ctx context.Context, msgs ...outbox.Message) error {
	w := b.store.Writer()
	return pgx.BeginFunc(ctx, b.store.Pool(), func(tx pgx.Tx) error {
		return w.Write(ctx, tx, msgs...)
	})
}

func TestWALConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		b := setupWAL(t, Options{})
		b.streaming(t)
		return storetest.Harness{
			Store:      b.store,
			Write:      b.write,
			Partitions: testPartitions,
			Sync:       b.store.Sync,
		}
	})
}
