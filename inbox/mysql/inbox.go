// Package mysql is the MySQL and MariaDB inbox: it records (consumer,
// message ID) pairs in a table, in the consumer's own database/sql
// transaction (github.com/go-sql-driver/mysql), so that each message's
// effect is applied once. See package inbox for the guarantees. Migrate
// creates the table:
//
//	CREATE TABLE <prefix>_inbox (
//	    consumer     VARCHAR(200) NOT NULL,
//	    message_id   VARCHAR(200) NOT NULL,
//	    processed_at DATETIME(6)  NOT NULL,
//	    token        BINARY(16)   NULL,     -- the Record call that inserted it
//	    PRIMARY KEY (consumer, message_id),
//	    KEY processed_idx (processed_at)
//	)
//
// It has the contract of inbox/postgres: a second delivery of an ID that a
// concurrent transaction recorded first waits for that transaction's
// outcome (InnoDB's duplicate-key check takes a shared lock on the key):
// after its commit it is a duplicate, after its rollback it is recorded. The
// SQL is MySQL 8.0 and MariaDB 10.6 alike: INSERT … ON DUPLICATE KEY UPDATE
// with a no-op update (affected rows 0 for a duplicate, 1 for a new pair),
// no RETURNING.
package mysql

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Defaults and limits of [Options].
const (
	// TablePrefixDefault is the default prefix of the table name: the table
	// is <prefix>_inbox, next to the outbox's <prefix>_messages.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix (MySQL's 64-byte names).
	MaxTablePrefixLen = 64 - len("_inbox")
)

// Options names the inbox table, in the database of the connection. The
// zero value of every field means its default.
type Options struct {
	// TablePrefix starts the table name, <prefix>_inbox; default
	// [TablePrefixDefault]: letters, digits and '_', not starting with a
	// digit, at most [MaxTablePrefixLen] bytes.
	TablePrefix string
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	return o
}

func (o Options) validate() error {
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return fmt.Errorf("inbox/mysql: Options.TablePrefix %w", err)
	}
	return nil
}

// MigrationSQL returns the statement Migrate runs (after defaults).
func (o Options) MigrationSQL() (string, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return "", err
	}
	return newQueries(o).migrate, nil
}

var (
	_ inbox.Runner[*sql.Tx] = (*Inbox)(nil)
	_ inbox.Cleaner         = (*Inbox)(nil)
)

// Inbox is a MySQL inbox. It is safe for concurrent use, does one round of
// I/O per call (Record: two) and never retries.
type Inbox struct {
	db *sql.DB
	q  queries
}

type queries struct {
	table   string
	migrate string
	insert  string
	cleanup string
}

func newQueries(o Options) queries {
	table := "`" + o.TablePrefix + "_inbox`"
	return queries{
		table: table,
		migrate: "CREATE TABLE IF NOT EXISTS " + table + ` (
    consumer     VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id   VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    processed_at DATETIME(6) NOT NULL,
    token        BINARY(16) NULL,
    PRIMARY KEY (consumer, message_id),
    KEY processed_idx (processed_at)
) ENGINE=InnoDB`,
		// The first write of the consumer's transaction. A no-op update on
		// a duplicate: affected rows 0 (the driver does not set
		// CLIENT_FOUND_ROWS unless asked), 1 for a new pair.
		insert: "INSERT INTO " + table + " (consumer, message_id, processed_at, token) VALUES ",
		// No SKIP LOCKED in a MySQL DELETE: a row of a transaction in
		// progress is newer than any retention window anyway.
		cleanup: "DELETE FROM " + table + " WHERE processed_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) ORDER BY processed_at LIMIT ?",
	}
}

// New returns an inbox using db (opened with
// github.com/go-sql-driver/mysql) and the table named by opts. It does
// not create the table (see [Inbox.Migrate]).
func New(db *sql.DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox/mysql: New needs a non-nil *sql.DB")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Inbox{db: db, q: newQueries(opts)}, nil
}

// Table returns the quoted table name.
func (in *Inbox) Table() string { return in.q.table }

// Migrate creates the table if it does not exist. It is idempotent and
// safe to run concurrently (CREATE TABLE IF NOT EXISTS).
func (in *Inbox) Migrate(ctx context.Context) error {
	if _, err := in.db.ExecContext(ctx, in.q.migrate); err != nil {
		return fmt.Errorf("inbox/mysql: migrate %s: %w", in.q.table, err)
	}
	return nil
}

const onDuplicate = " ON DUPLICATE KEY UPDATE consumer = consumer"

// Process runs fn at most once per (consumer, messageID), inside tx, the
// caller's transaction. It first records the pair in tx; if a committed
// transaction recorded it already it returns (false, nil) without calling
// fn. Otherwise it calls fn(ctx, tx) and returns (true, nil) if fn
// succeeds: the caller then commits, and the record and fn's effect commit
// together. On any error (recording or fn's, returned unchanged) it returns
// (false, err) and the caller must roll tx back. A concurrent transaction
// that recorded the same pair first makes Process wait for its outcome.
func (in *Inbox) Process(ctx context.Context, tx *sql.Tx, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if tx == nil {
		return false, errors.New("inbox/mysql: Process needs a non-nil transaction")
	}
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, in.q.insert+"(?, ?, UTC_TIMESTAMP(6), NULL)"+onDuplicate, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("inbox/mysql: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox/mysql: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	if n == 0 {
		return false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	return true, nil
}

// Record records messageIDs for consumer in tx, the caller's transaction,
// and reports for each whether it is new: fresh[i] is true when
// messageIDs[i] was not recorded before (and is not a repeat of an earlier
// ID of the same call). Two statements: one multi-row INSERT, in sorted ID
// order (a fixed lock order, so that overlapping concurrent batches cannot
// deadlock), that stamps the rows it inserts with a random token, then a
// read of the rows bearing the token. The caller applies the effects of
// the new messages only, in tx, and commits. After an error the caller
// must roll back.
func (in *Inbox) Record(ctx context.Context, tx *sql.Tx, consumer string, messageIDs []string) (fresh []bool, err error) {
	if tx == nil {
		return nil, errors.New("inbox/mysql: Record needs a non-nil transaction")
	}
	if err := inbox.ValidateBatch(consumer, messageIDs); err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("inbox/mysql: record: %w", err)
	}
	sorted := slices.Clone(messageIDs)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	var b strings.Builder
	b.WriteString(in.q.insert)
	args := make([]any, 0, 3*len(sorted))
	for i, id := range sorted {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, UTC_TIMESTAMP(6), ?)")
		args = append(args, consumer, id, token)
	}
	b.WriteString(onDuplicate)
	if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
		return nil, fmt.Errorf("inbox/mysql: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	args = args[:0]
	args = append(args, consumer, token)
	for _, id := range sorted {
		args = append(args, id)
	}
	rows, err := tx.QueryContext(ctx, "SELECT message_id FROM "+in.q.table+" WHERE consumer = ? AND token = ? AND message_id IN ("+
		strings.TrimSuffix(strings.Repeat("?, ", len(sorted)), ", ")+")", args...)
	if err != nil {
		return nil, fmt.Errorf("inbox/mysql: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	defer rows.Close()
	inserted := make([]string, 0, len(sorted))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("inbox/mysql: record messages for consumer %q: %w", consumer, err)
		}
		inserted = append(inserted, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox/mysql: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	return freshFlags(messageIDs, inserted), nil
}

// freshFlags marks the first occurrence of each inserted ID.
func freshFlags(ids, inserted []string) []bool {
	isNew := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		isNew[id] = true
	}
	fresh := make([]bool, len(ids))
	for i, id := range ids {
		if isNew[id] {
			fresh[i] = true
			delete(isNew, id)
		}
	}
	return fresh
}

// Run begins a transaction, calls Process in it and commits (rolls back
// for a duplicate or on error). It implements inbox.Runner. A commit error
// leaves the outcome unknown to the caller; the redelivery that follows
// finds out.
func (in *Inbox) Run(ctx context.Context, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox/mysql: begin: %w", err)
	}
	processed, err = in.Process(ctx, tx, consumer, messageID, fn)
	if err != nil || !processed {
		_ = tx.Rollback()
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox/mysql: commit message %q for consumer %q: %w", messageID, consumer, err)
	}
	return true, nil
}

// Cleanup deletes up to limit records processed more than olderThan ago (by
// the server's clock), oldest first, and returns how many it deleted.
func (in *Inbox) Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if err := inbox.ValidateCleanup(olderThan, limit); err != nil {
		return 0, err
	}
	res, err := in.db.ExecContext(ctx, in.q.cleanup, olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("inbox/mysql: cleanup %s: %w", in.q.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox/mysql: cleanup %s: %w", in.q.table, err)
	}
	return n, nil
}
