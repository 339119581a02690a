// Package sqlite is the SQLite inbox (database/sql, *sql.Tx; tested with the
// pure-Go driver modernc.org/sqlite): it records (consumer, message ID)
// pairs in a table, in the consumer's own transaction, so that each
// message's effect is applied once. See package inbox for the guarantees.
//
// The table, created by Migrate:
//
//	CREATE TABLE <prefix>_inbox (
//	    consumer     TEXT    NOT NULL,
//	    message_id   TEXT    NOT NULL,
//	    processed_at INTEGER NOT NULL, -- Unix milliseconds, from Options.Now
//	    PRIMARY KEY (consumer, message_id)
//	) WITHOUT ROWID
//
// # Opening the database
//
// SQLite has one writer at a time. Open the database with a busy timeout so
// that concurrent transactions wait for the lock instead of failing with
// SQLITE_BUSY, and preferably in WAL mode, for example with modernc.org/sqlite:
//
//	sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//
// With _txlock=immediate every transaction takes the write lock at BEGIN, so
// a transaction that reads before calling Process cannot fail to upgrade its
// lock. [Inbox.Run] records the pair as the first statement of its
// transaction, so it works with deferred transactions too.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/inbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Defaults and limits of [Options].
const (
	// TablePrefixDefault is the default prefix of the table name: the table
	// is <prefix>_inbox.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix: the same bound as the PostgreSQL
	// inbox, so that one prefix works for both.
	MaxTablePrefixLen = storepolicy.MaxIdentifierLen - len("_inbox_processed_idx")
)

// Options configures an [Inbox]. The zero value of every field means its
// default.
type Options struct {
	// TablePrefix starts the table name, <prefix>_inbox; default
	// [TablePrefixDefault]. It must match ^[A-Za-z_][A-Za-z0-9_]*$, at most
	// [MaxTablePrefixLen] bytes, and is quoted.
	TablePrefix string
	// Now is the clock that stamps records and measures retention; default
	// time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) validate() error {
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return fmt.Errorf("inbox/sqlite: Options.TablePrefix %w", err)
	}
	return nil
}

// quote quotes an identifier for SQLite (validated names never hold '"').
func quote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

var (
	_ inbox.Runner[*sql.Tx] = (*Inbox)(nil)
	_ inbox.Cleaner         = (*Inbox)(nil)
)

// Inbox is a SQLite inbox. It is safe for concurrent use, does one round of
// I/O per call and never retries.
type Inbox struct {
	db      *sql.DB
	now     func() time.Time
	table   string
	migrate []string
	insert  string
	cleanup string
}

// New returns an inbox using db and the table named by opts. It does not
// create the table (see [Inbox.Migrate]).
func New(db *sql.DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox/sqlite: New needs a non-nil *sql.DB")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	table := quote(opts.TablePrefix + "_inbox")
	idx := quote(opts.TablePrefix + "_inbox_processed_idx")
	return &Inbox{
		db:    db,
		now:   opts.Now,
		table: table,
		migrate: []string{
			`CREATE TABLE IF NOT EXISTS ` + table + ` (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID`,
			`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + table + ` (processed_at)`,
		},
		insert: `INSERT INTO ` + table + ` (consumer, message_id, processed_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
		// Oldest first through the processed_at index, one batch.
		cleanup: `DELETE FROM ` + table + ` WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM ` + table + ` WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`,
	}, nil
}

// Table returns the quoted table name, for the application's own queries.
func (in *Inbox) Table() string { return in.table }

// Migrate creates the table and its index if they do not exist, in one
// transaction. It is idempotent.
func (in *Inbox) Migrate(ctx context.Context) error {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inbox/sqlite: migrate: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, stmt := range in.migrate {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inbox/sqlite: migrate %s: %w", in.table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("inbox/sqlite: migrate: commit: %w", err)
	}
	return nil
}

// Process runs fn at most once per (consumer, messageID), inside tx, the
// caller's transaction. It first records the pair in tx (INSERT … ON
// CONFLICT DO NOTHING); if the pair is already recorded it returns
// (false, nil) without calling fn. Otherwise it calls fn(ctx, tx) and returns
// (true, nil) if fn succeeds: the caller then commits, and the record and
// fn's effect commit together. On any error (fn's is returned unchanged) it
// returns (false, err) and the caller must roll tx back.
func (in *Inbox) Process(ctx context.Context, tx *sql.Tx, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if tx == nil {
		return false, errors.New("inbox/sqlite: Process needs a non-nil transaction")
	}
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, in.insert, consumer, messageID, in.now().UnixMilli())
	if err != nil {
		return false, fmt.Errorf("inbox/sqlite: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox/sqlite: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	if n == 0 {
		return false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	return true, nil
}

// recordChunk bounds the rows of one INSERT of Record (SQLite allows 32,766
// bound parameters).
const recordChunk = 1000

// Record records messageIDs for consumer in tx, the caller's transaction,
// and reports for each whether it is new: fresh[i] is true when
// messageIDs[i] was not recorded before (and is not a repeat of an earlier
// ID of the same call). The caller applies the effects of the new messages
// only, in tx, and commits: records and effects commit together. After an
// error the caller must roll back. One INSERT per 1,000 IDs.
func (in *Inbox) Record(ctx context.Context, tx *sql.Tx, consumer string, messageIDs []string) (fresh []bool, err error) {
	if tx == nil {
		return nil, errors.New("inbox/sqlite: Record needs a non-nil transaction")
	}
	if err := inbox.ValidateBatch(consumer, messageIDs); err != nil {
		return nil, err
	}
	now := in.now().UnixMilli()
	isNew := make(map[string]bool, len(messageIDs))
	for start := 0; start < len(messageIDs); start += recordChunk {
		part := messageIDs[start:min(start+recordChunk, len(messageIDs))]
		args := make([]any, 0, 3*len(part))
		for _, id := range part {
			args = append(args, consumer, id, now)
		}
		q := `INSERT INTO ` + in.table + ` (consumer, message_id, processed_at) VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(part)), ", ") +
			` ON CONFLICT DO NOTHING RETURNING message_id`
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("inbox/sqlite: record %d messages for consumer %q: %w", len(part), consumer, err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("inbox/sqlite: record messages for consumer %q: %w", consumer, err)
			}
			isNew[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("inbox/sqlite: record %d messages for consumer %q: %w", len(part), consumer, err)
		}
	}
	fresh = make([]bool, len(messageIDs))
	for i, id := range messageIDs {
		if isNew[id] {
			fresh[i] = true
			delete(isNew, id)
		}
	}
	return fresh, nil
}

// Run begins a transaction, calls Process in it and commits (rolls back for
// a duplicate or on error). It implements inbox.Runner.
func (in *Inbox) Run(ctx context.Context, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox/sqlite: begin: %w", err)
	}
	processed, err = in.Process(ctx, tx, consumer, messageID, fn)
	if err != nil || !processed {
		_ = tx.Rollback()
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox/sqlite: commit message %q for consumer %q: %w", messageID, consumer, err)
	}
	return true, nil
}

// Cleanup deletes up to limit records processed more than olderThan ago (by
// Options.Now), oldest first, and returns how many it deleted.
func (in *Inbox) Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if err := inbox.ValidateCleanup(olderThan, limit); err != nil {
		return 0, err
	}
	cutoff := in.now().Add(-olderThan).UnixMilli()
	res, err := in.db.ExecContext(ctx, in.cleanup, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("inbox/sqlite: cleanup %s: %w", in.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox/sqlite: cleanup %s: %w", in.table, err)
	}
	return n, nil
}
