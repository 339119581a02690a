// Package inboxtest gives tests a consumer inbox to run the consume
// helpers with.
package inboxtest

import (
	"database/sql"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite" // the inbox's database

	inboxsqlite "github.com/outboxrelay/outbox/inbox/sqlite"
)

// SQLite returns a migrated SQLite inbox in a file of the test's temporary
// directory, closed when the test ends.
func SQLite(t testing.TB) *inboxsqlite.Inbox {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "inbox.db")+"?_pragma=busy_timeout(30000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	in, err := inboxsqlite.New(db, inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return in
}
