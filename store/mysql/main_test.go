package mysql

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "relay" {
		os.Exit(childRelay())
	}
	testenv.Main(m)
}

// testPartitions is P for the tests' stores: small, so that tests that hold
// every partition stay cheap, yet enough to spread keys.
const testPartitions = 8

// bundle is what setup returns: a fresh, migrated store in its own
// database.
type bundle struct {
	ctx   context.Context
	url   string
	opts  Options
	store *Store
}

// setup opens a migrated store in a new database of the shared MariaDB
// server with opts (Partitions filled in when zero).
func setup(t testing.TB, opts ...Options) *bundle {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Partitions == 0 {
		o.Partitions = testPartitions
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	u := testenv.MySQLURL(t)
	s, err := Open(ctx, u, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &bundle{ctx: ctx, url: u, opts: s.Options(), store: s}
}

// write commits msgs in one transaction with the store's Write. It may be
// called from any goroutine.
func (b *bundle) write(ctx context.Context, msgs ...outbox.Message) error {
	tx, err := b.store.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := b.store.Write(ctx, tx, msgs...); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// count returns the number of rows of the store's table with suffix
// ("_messages", "_dead_letters", …).
func (b *bundle) count(t *testing.T, suffix string) int {
	t.Helper()
	var n int
	if err := b.store.DB().QueryRowContext(b.ctx, "SELECT count(*) FROM "+quoteIdent(b.opts.TablePrefix+suffix)).Scan(&n); err != nil {
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
