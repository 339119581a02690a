package sqlite

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testPartitions is P for the tests' stores: small, so that tests that hold
// every partition stay cheap, yet enough to spread keys.
const testPartitions = 8

// clock is an adjustable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// bundle is what setup returns: a fresh, migrated store in its own file.
type bundle struct {
	ctx   context.Context
	path  string
	opts  Options
	store *Store
}

// setup opens a migrated store in a new database file with opts (Partitions
// filled in when zero).
func setup(t testing.TB, opts ...Options) *bundle {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Partitions == 0 {
		o.Partitions = testPartitions
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, err := Open(ctx, path, o)
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
	return &bundle{ctx: ctx, path: path, opts: s.Options(), store: s}
}

// write commits msgs in one transaction with the store's Write. It may be
// called from any goroutine.
func (b *bundle) write(t *testing.T, msgs ...outbox.Message) error {
	t.Helper()
	tx, err := b.store.DB().BeginTx(b.ctx, nil)
	if err != nil {
		return err
	}
	if err := b.store.Write(b.ctx, tx, msgs...); err != nil {
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

// cursors returns a cursor from the start for every partition, with epoch 0.
func (b *bundle) cursors(t *testing.T) []outbox.Cursor {
	t.Helper()
	p, err := b.store.Partitions(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cursors := make([]outbox.Cursor, p)
	for i := range cursors {
		cursors[i].Partition = i
	}
	return cursors
}

// all fetches every pending record of every partition.
func (b *bundle) all(t *testing.T) []outbox.Record {
	t.Helper()
	recs, err := b.store.Fetch(b.ctx, b.cursors(t), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// leaseAll takes every partition for node.
func (b *bundle) leaseAll(t *testing.T, node string) map[int]outbox.Lease {
	t.Helper()
	ls, err := b.store.AcquireLeases(b.ctx, node, nil, outbox.MaxPartitions, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[int]outbox.Lease, len(ls))
	for _, l := range ls {
		m[l.Partition] = l
	}
	return m
}
