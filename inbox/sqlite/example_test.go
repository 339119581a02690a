package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxrelay/outbox/inbox/sqlite"
)

// A consumer handles each message through the inbox: the record and the
// effect commit together, and a redelivery is dropped.
func ExampleInbox_Run() {
	dir, err := os.MkdirTemp("", "inbox-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	in, err := sqlite.New(db, sqlite.Options{})
	if err != nil {
		panic(err)
	}
	if err := in.Migrate(ctx); err != nil {
		panic(err)
	}

	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO balances VALUES ('alice', 10)
			ON CONFLICT (account) DO UPDATE SET amount = amount + 10`)
		return err
	}
	// The same message (same outbox ID) delivered twice.
	for range 2 {
		processed, err := in.Run(ctx, "billing", "0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d", credit)
		fmt.Println("processed:", processed, "err:", err)
	}
	var amount int
	if err := db.QueryRow(`SELECT amount FROM balances WHERE account = 'alice'`).Scan(&amount); err != nil {
		panic(err)
	}
	fmt.Println("balance:", amount)
	// Output:
	// processed: true err: <nil>
	// processed: false err: <nil>
	// balance: 10
}
