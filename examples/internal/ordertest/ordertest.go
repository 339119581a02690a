// Package ordertest is what the ORM examples' tests share: a fresh
// PostgreSQL database with the outbox tables, a relay recording what it
// publishes, and a wait for a transaction blocked on a lock.
package ordertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// waitFor bounds every wait of the tests.
const waitFor = 30 * time.Second

// Outbox returns the DSN of a new database holding the outbox tables
// (schema public, prefix outbox, 4 partitions) and the store over it,
// whose Writer takes key locks when keyLocks is true.
func Outbox(t *testing.T, keyLocks bool) (string, *postgres.Store) {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	store, err := postgres.Open(t.Context(), dsn, postgres.Options{Partitions: 4, KeyLocks: new(keyLocks)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return dsn, store
}

// Recorder is a publisher that acknowledges everything and records the
// messages in publish order.
type Recorder struct {
	mu   sync.Mutex
	msgs []outbox.Message
}

// Publish implements outbox.Publisher.
func (r *Recorder) Publish(_ context.Context, msgs []*outbox.Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.msgs = append(r.msgs, *m)
	}
	return make([]error, len(msgs))
}

// Close implements outbox.Publisher.
func (r *Recorder) Close() error { return nil }

// Relay runs a relay over store until the test ends, publishing to the
// returned Recorder.
func Relay(t *testing.T, store *postgres.Store) *Recorder {
	t.Helper()
	rec := &Recorder{}
	relaytest.Start(t, store, rec, outbox.Config{PollInterval: 10 * time.Millisecond})
	return rec
}

// Published waits until n messages were published and returns them in
// publish order.
func (r *Recorder) Published(t *testing.T, n int) []outbox.Message {
	t.Helper()
	relaytest.WaitFor(t, "the relay to publish the messages", waitFor, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.msgs) >= n
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Message(nil), r.msgs...)
}

// WaitForLockWait waits until a session of dsn's database waits for a
// lock (a row lock, or a key's advisory lock).
func WaitForLockWait(t *testing.T, dsn string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	relaytest.WaitFor(t, "a transaction to wait for a lock", waitFor, func() bool {
		var n int
		err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}
