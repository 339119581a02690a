package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testPartitions is P for the tests' stores: small, so that tests that hold
// every partition stay cheap, yet enough to spread keys.
const testPartitions = 8

// bundle is what setup returns: a fresh, migrated store in its own database
// and schema.
type bundle struct {
	ctx   context.Context
	dsn   string
	opts  Options
	store *Store
}

// setup opens a migrated store on a new database, in a schema named after the
// test, with opts (Schema and Partitions filled in when zero).
func setup(t testing.TB, opts ...Options) *bundle {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Schema == "" {
		o.Schema = testenv.Name(t)
	}
	if o.Partitions == 0 {
		o.Partitions = testPartitions
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	rememberServer(testenv.PostgresServerDSN(t))
	dsn := testenv.PostgresDSN(t)
	s, err := Open(ctx, dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &bundle{ctx: ctx, dsn: dsn, opts: s.Options(), store: s}
}

// write commits msgs in one pgx transaction with the store's writer.
func (b *bundle) write(t *testing.T, msgs ...outbox.Message) error {
	t.Helper()
	return pgx.BeginFunc(b.ctx, b.store.Pool(), func(tx pgx.Tx) error {
		return b.store.Writer().Write(b.ctx, tx, msgs...)
	})
}

// count returns the number of rows of the store's table with suffix
// ("_messages", "_dead_letters", …).
func (b *bundle) count(t *testing.T, suffix string) int {
	t.Helper()
	var n int
	table := pgx.Identifier{b.opts.Schema, b.opts.TablePrefix + suffix}.Sanitize()
	if err := b.store.Pool().QueryRow(b.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// all fetches every pending record of every partition.
func (b *bundle) all(t *testing.T) []outbox.Record {
	t.Helper()
	p, err := b.store.Partitions(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cursors := make([]outbox.Cursor, p)
	for i := range cursors {
		cursors[i].Partition = i
	}
	recs, err := b.store.Fetch(b.ctx, cursors, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
