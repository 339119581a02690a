package postgres

import (
	"cmp"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Defaults and limits of [Options].
const (
	// SchemaDefault is the default schema of the inbox table.
	SchemaDefault = "public"
	// TablePrefixDefault is the default prefix of the inbox table name: the
	// table is <prefix>_inbox, next to the outbox's <prefix>_messages.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix so that every derived name
	// ("<prefix>_inbox_processed_idx" is the longest) fits PostgreSQL's
	// 63-byte identifier limit.
	MaxTablePrefixLen = storepolicy.MaxIdentifierLen - len("_inbox_processed_idx")
)

// Options names the inbox table. The zero value of every field means its
// default.
type Options struct {
	// Schema holds the inbox table; default [SchemaDefault]. It must match
	// ^[A-Za-z_][A-Za-z0-9_]{0,62}$ and is quoted, so it is case-sensitive.
	// Migrate creates it if missing.
	Schema string
	// TablePrefix starts the table name, <prefix>_inbox; default
	// [TablePrefixDefault]. Same rule as Schema, at most [MaxTablePrefixLen]
	// bytes.
	TablePrefix string
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.Schema = cmp.Or(o.Schema, SchemaDefault)
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	return o
}

// validate reports the first invalid field of o (after defaults), naming it.
func (o Options) validate() error {
	if err := storepolicy.CheckIdentifier(o.Schema, storepolicy.MaxIdentifierLen); err != nil {
		return fmt.Errorf("inbox/postgres: Options.Schema %w", err)
	}
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return fmt.Errorf("inbox/postgres: Options.TablePrefix %w", err)
	}
	return nil
}

// Table returns the quoted, schema-qualified name of the inbox table for these
// options (after defaults), for the application's own queries.
func (o Options) Table() (string, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return "", err
	}
	return newQueries(o).table, nil
}

// MigrationSQL returns the statements Migrate runs (after defaults), for
// review or for a migration tool of the application's own. Run them in one
// transaction.
func (o Options) MigrationSQL() ([]string, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	return newQueries(o).migrate, nil
}

// queries holds every SQL statement of the inbox. Names are validated,
// quoted identifiers from Options; every value is a bound parameter.
type queries struct {
	table   string // quoted, qualified
	lockKey string // advisory lock key text for Migrate
	migrate []string
	insert  string
	record  string
	cleanup string
}

func newQueries(o Options) queries {
	table := pgx.Identifier{o.Schema, o.TablePrefix + "_inbox"}.Sanitize()
	idx := pgx.Identifier{o.TablePrefix + "_inbox_processed_idx"}.Sanitize()
	var q queries
	q.table = table
	q.lockKey = "outbox.inbox.migrate:" + o.Schema + "." + o.TablePrefix
	q.migrate = []string{
		`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{o.Schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + table + ` (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
)`,
		`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + table + ` (processed_at)`,
	}

	// The first write of the consumer's transaction. A concurrent
	// transaction that inserted the same key first makes this one wait for
	// its outcome: after its commit nothing is inserted (a duplicate), after
	// its rollback this insert goes ahead. Plan: Insert on the table,
	// conflict arbiter the primary key index.
	q.insert = `INSERT INTO ` + table + ` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`

	// A batch: one statement, IDs in sorted order (a fixed lock order, so
	// that overlapping concurrent batches cannot deadlock), returning the
	// IDs it inserted. A repeated ID of the same batch conflicts with its
	// first copy and is not returned.
	q.record = `INSERT INTO ` + table + ` (consumer, message_id)
SELECT $1, u.id FROM unnest($2::text[]) AS u(id) ORDER BY u.id
ON CONFLICT DO NOTHING
RETURNING message_id`

	// One batch of the retention cleanup, oldest first, by row address so
	// that the delete touches only the chosen rows (the rows are locked, so
	// their ctid cannot change before the delete). SKIP LOCKED keeps
	// concurrent cleaners, and a late duplicate holding a row, from waiting
	// on each other. Plan (checked by TestCleanupPlan):
	//   Delete on <prefix>_inbox
	//     InitPlan: Limit -> LockRows -> Index Scan using
	//       <prefix>_inbox_processed_idx (Index Cond: processed_at < ...)
	//     -> Tid Scan on <prefix>_inbox (TID Cond: ctid = ANY ($0))
	q.cleanup = `DELETE FROM ` + table + `
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + table + `
    WHERE processed_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`
	return q
}
