package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/outbox/inbox"
)

var (
	_ inbox.Runner[*sql.Tx] = (*SQLInbox)(nil)
	_ inbox.Cleaner         = (*SQLInbox)(nil)
)

// SQLInbox is a PostgreSQL inbox used through database/sql (for example with
// the driver github.com/jackc/pgx/v5/stdlib). It behaves exactly as [Inbox]
// and shares its table. It is safe for concurrent use, does one round of I/O
// per call and never retries.
type SQLInbox struct {
	db *sql.DB
	q  queries
}

// NewSQL returns an inbox using db and the table named by opts. It does not
// create the table (see [SQLInbox.Migrate]).
func NewSQL(db *sql.DB, opts Options) (*SQLInbox, error) {
	if db == nil {
		return nil, errors.New("inbox/postgres: NewSQL needs a non-nil *sql.DB")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &SQLInbox{db: db, q: newQueries(opts)}, nil
}

// Table returns the quoted, schema-qualified table name.
func (in *SQLInbox) Table() string { return in.q.table }

// Migrate is [Inbox.Migrate] over database/sql.
func (in *SQLInbox) Migrate(ctx context.Context) error {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inbox/postgres: migrate: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, in.q.lockKey); err != nil {
		return fmt.Errorf("inbox/postgres: migrate: lock: %w", err)
	}
	for _, stmt := range in.q.migrate {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inbox/postgres: migrate %s: %w", in.q.table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("inbox/postgres: migrate: commit: %w", err)
	}
	return nil
}

// Process is [Inbox.Process] with a database/sql transaction: it records
// (consumer, messageID) in tx and calls fn(ctx, tx) only if the pair is new,
// returning (true, nil) when fn ran, (false, nil) for a duplicate and
// (false, err) on error, after which the caller must roll tx back.
func (in *SQLInbox) Process(ctx context.Context, tx *sql.Tx, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if tx == nil {
		return false, errors.New("inbox/postgres: Process needs a non-nil transaction")
	}
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, in.q.insert, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("inbox/postgres: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox/postgres: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	if n == 0 {
		return false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	return true, nil
}

// Record is [Inbox.Record] with a database/sql transaction. The driver must
// accept a []string for a text[] parameter (github.com/jackc/pgx/v5/stdlib
// does).
func (in *SQLInbox) Record(ctx context.Context, tx *sql.Tx, consumer string, messageIDs []string) (fresh []bool, err error) {
	if tx == nil {
		return nil, errors.New("inbox/postgres: Record needs a non-nil transaction")
	}
	if err := inbox.ValidateBatch(consumer, messageIDs); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, in.q.record, consumer, messageIDs)
	if err != nil {
		return nil, fmt.Errorf("inbox/postgres: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	defer rows.Close()
	inserted := make([]string, 0, len(messageIDs))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("inbox/postgres: record messages for consumer %q: %w", consumer, err)
		}
		inserted = append(inserted, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox/postgres: record %d messages for consumer %q: %w", len(messageIDs), consumer, err)
	}
	return freshFlags(messageIDs, inserted), nil
}

// Run is [Inbox.Run] over database/sql: begin, Process, commit.
func (in *SQLInbox) Run(ctx context.Context, consumer, messageID string, fn inbox.Func[*sql.Tx]) (processed bool, err error) {
	if err := inbox.ValidateKey(consumer, messageID); err != nil {
		return false, err
	}
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox/postgres: begin: %w", err)
	}
	processed, err = in.Process(ctx, tx, consumer, messageID, fn)
	if err != nil || !processed {
		_ = tx.Rollback()
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox/postgres: commit message %q for consumer %q: %w", messageID, consumer, err)
	}
	return true, nil
}

// Cleanup is [Inbox.Cleanup] over database/sql.
func (in *SQLInbox) Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if err := inbox.ValidateCleanup(olderThan, limit); err != nil {
		return 0, err
	}
	res, err := in.db.ExecContext(ctx, in.q.cleanup, olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("inbox/postgres: cleanup %s: %w", in.q.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox/postgres: cleanup %s: %w", in.q.table, err)
	}
	return n, nil
}
