// Package postgres is the PostgreSQL inbox: it records (consumer, message ID)
// pairs in a table, in the consumer's own transaction, so that each message's
// effect is applied once. See package inbox for the guarantees.
//
// [Inbox] works with pgx (pgx.Tx); [SQLInbox] with database/sql (*sql.Tx,
// for example through github.com/jackc/pgx/v5/stdlib). Both use the same
// table, created by Migrate:
//
//	CREATE TABLE <schema>.<prefix>_inbox (
//	    consumer     text        NOT NULL,
//	    message_id   text        NOT NULL,
//	    processed_at timestamptz NOT NULL DEFAULT now(),
//	    PRIMARY KEY (consumer, message_id)
//	)
//
// # Isolation levels
//
// At READ COMMITTED (PostgreSQL's default) a second delivery of an ID waits
// for the first one's transaction and then sees the record: a duplicate. At
// REPEATABLE READ and SERIALIZABLE it fails instead with a serialization
// error (SQLSTATE 40001) when the first one committed after the second one's
// snapshot was taken; the helpers then let the broker redeliver it, and the
// redelivery is dropped as a duplicate.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outbox/inbox"
)

// DB is what an [Inbox] needs from the database: *pgxpool.Pool satisfies it,
// and so does *pgx.Conn for a caller that uses it from one goroutine at a
// time.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

var (
	_ inbox.Runner[pgx.Tx] = (*Inbox)(nil)
	_ inbox.Cleaner        = (*Inbox)(nil)
)

// Inbox is a PostgreSQL inbox used through pgx. It is safe for concurrent
// use if its DB is (a pool is). It does one round of I/O per call and never
// retries.
type Inbox struct {
	db DB
	q  queries
}

// New returns an inbox using db and the table named by opts. It does not
// create the table (see [Inbox.Migrate]).
func New(db DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox/postgres: New needs a non-nil DB (a *pgxpool.Pool)")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Inbox{db: db, q: newQueries(opts)}, nil
}

// Table returns the quoted, schema-qualified table name.
func (in *Inbox) Table() string { return in.q.table }

// Migrate creates the schema, the table and its index if they do not exist,
// in one transaction under an advisory lock, so that concurrent Migrate calls
// are safe. It is idempotent.
func (in *Inbox) Migrate(ctx context.Context) error {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox/postgres: migrate: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, in.q.lockKey); err != nil {
		return fmt.Errorf("inbox/postgres: migrate: lock: %w", err)
	}
	for _, stmt := range in.q.migrate {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("inbox/postgres: migrate %s: %w", in.q.table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox/postgres: migrate: commit: %w", err)
	}
	return nil
}

// Process runs fn at most once per (consumer, messageID), inside tx, the
// caller's transaction. It first records the pair in tx (INSERT … ON
// CONFLICT DO NOTHING); if the pair was already recorded by a committed
// transaction it returns (false, nil) without calling fn. Otherwise it
// calls fn(ctx, tx) and returns (true, nil) if fn succeeds: the caller then
// commits, and the record and fn's effect commit together.
//
// On any error (recording or fn's, returned unchanged) it returns
// (false, err) and the caller must roll tx back. A concurrent transaction
// that recorded the same pair first makes Process wait for its outcome.
func (in *Inbox) Process(ctx context.Context, tx pgx.Tx, consumer, messageID string, fn inbox.Func[pgx.Tx]) (processed bool, err error) {
	if tx == nil {
		return false, errors.New("inbox/postgres: Process needs a non-nil transaction")
	}
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, in.q.insert, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("inbox/postgres: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	return true, nil
}

// Record records messageIDs for consumer in tx, the caller's transaction,
// in one statement, and reports for each whether it is new: fresh[i] is true
// when messageIDs[i] was not recorded before (and is not a repeat of an
// earlier ID of the same call). The caller applies the effects of the new
// messages only, in tx, and commits: records and effects commit together.
// After an error the caller must roll back. Concurrent transactions recording
// the same IDs wait for each other as with Process.
func (in *Inbox) Record(ctx context.Context, tx pgx.Tx, consumer string, messageIDs []string) (fresh []bool, err error) {
	if tx == nil {
		return nil, errors.New("inbox/postgres: Record needs a non-nil transaction")
	}
	if err := inbox.ValidateBatch(consumer, messageIDs); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, in.q.record, consumer, messageIDs)
	if err != nil {
		return nil, fmt.Errorf("inbox/postgres: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox/postgres: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
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

// Run begins a transaction on the DB, calls Process in it and commits (rolls
// back for a duplicate or on error). It implements inbox.Runner. A commit
// error leaves the outcome unknown to the caller; the redelivery that follows
// finds out (it is dropped if the commit had gone through).
func (in *Inbox) Run(ctx context.Context, consumer, messageID string, fn inbox.Func[pgx.Tx]) (processed bool, err error) {
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox/postgres: begin: %w", err)
	}
	processed, err = in.Process(ctx, tx, consumer, messageID, fn)
	if err != nil || !processed {
		// Rollback errors are moot: nothing is kept either way.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox/postgres: commit message %q for consumer %q: %w", messageID, consumer, err)
	}
	return true, nil
}

// Cleanup deletes up to limit records processed more than olderThan ago (by
// the database's clock), oldest first, and returns how many it deleted. It
// skips rows locked by other transactions. Safe to run from several
// processes at once.
func (in *Inbox) Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if err := inbox.ValidateCleanup(olderThan, limit); err != nil {
		return 0, err
	}
	tag, err := in.db.Exec(ctx, in.q.cleanup, olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("inbox/postgres: cleanup %s: %w", in.q.table, err)
	}
	return tag.RowsAffected(), nil
}
