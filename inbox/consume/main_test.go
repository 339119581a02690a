package consume_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/sqlite"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newInbox returns a migrated SQLite inbox and its database, with an effects
// table counting how often each message's effect was applied.
func newInbox(t *testing.T) (*sqlite.Inbox, *sql.DB) {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "consumer.db") + "?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	in, err := sqlite.New(db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (id TEXT PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return in, db
}

func applyEffect(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1`, id)
	return err
}

// effectCount returns how often the effect of id was applied.
func effectCount(t *testing.T, db *sql.DB, id string) int {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT coalesce(max(n), 0) FROM effects WHERE id = ?`, id).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func effectTotals(t *testing.T, db *sql.DB) (rows, maxN int) {
	t.Helper()
	if err := db.QueryRow(`SELECT count(*), coalesce(max(n), 0) FROM effects`).Scan(&rows, &maxN); err != nil {
		t.Fatal(err)
	}
	return rows, maxN
}

// crashAfterCommit is a Runner that calls crash right after the inner
// runner committed: the process "dies" between the commit and the ack.
type crashAfterCommit[Tx any] struct {
	inner inbox.Runner[Tx]
	crash func()
}

func (c crashAfterCommit[Tx]) Run(ctx context.Context, consumer, id string, fn inbox.Func[Tx]) (bool, error) {
	p, err := c.inner.Run(ctx, consumer, id, fn)
	if err == nil {
		c.crash()
	}
	return p, err
}

// eventually polls cond until it holds or 30 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}
