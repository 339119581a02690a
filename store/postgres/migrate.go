package postgres

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded schema change, numbered by its file name
// (NNNN_name.sql).
type migration struct {
	version int
	name    string
	sql     string // placeholders not yet replaced
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, f := range files {
		base := path.Base(f)
		num, name, ok := strings.Cut(strings.TrimSuffix(base, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("postgres: migration file %s is not named NNNN_name.sql", base)
		}
		b, err := migrationFiles.ReadFile(f)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	for i := range ms {
		if ms[i].version != i+1 {
			return nil, fmt.Errorf("postgres: migrations are not numbered 1, 2, 3…: found %d at position %d", ms[i].version, i+1)
		}
	}
	return ms, nil
}

// render replaces the identifier placeholders of a migration with the
// quoted names. It fails on an unknown placeholder.
func (n names) render(sql string) (string, error) {
	r := strings.NewReplacer(
		"{{schema}}", n.schema,
		"{{messages}}", n.messages,
		"{{dead_letters}}", n.deadLetters,
		"{{leases}}", n.leases,
		"{{relays}}", n.relays,
		"{{meta}}", n.meta,
		"{{migrations}}", n.migrations,
		"{{pending_idx}}", n.pendingIdx,
		"{{published_idx}}", n.publishedIdx,
		"{{failed_idx}}", n.failedIdx,
		"{{txid_idx}}", n.txidIdx,
		"{{dead_key_idx}}", n.deadKeyIdx,
		"{{dead_topic_idx}}", n.deadTopicIdx,
	)
	out := r.Replace(sql)
	if i := strings.Index(out, "{{"); i >= 0 {
		end := min(len(out), i+40)
		return "", fmt.Errorf("postgres: unknown placeholder in migration: %q", out[i:end])
	}
	return out, nil
}

// Migrate creates or upgrades the outbox tables: it applies, in one
// transaction, the embedded migrations not yet recorded in
// <prefix>_migrations. It is idempotent and may run concurrently from many
// processes: a transaction-scoped advisory lock serialises them.
//
// The first Migrate fixes P (Options.Partitions, default
// outbox.DefaultPartitions) in <prefix>_meta and creates one lease row per
// partition. A later Migrate with a non-zero Options.Partitions different
// from the stored P fails, naming both values, and changes nothing.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.check("migrate"); err != nil {
		return err
	}
	ms, err := migrations()
	if err != nil {
		return err
	}
	var p int
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		p, err = s.migrate(ctx, tx, ms)
		return err
	})
	if err != nil {
		if errors.Is(err, errPartitionsMismatch) {
			return err
		}
		return fmt.Errorf("postgres: migrate schema %q, prefix %q: %w", s.opts.Schema, s.opts.TablePrefix, err)
	}
	s.partitions.Store(int64(p))
	return nil
}

var errPartitionsMismatch = errors.New("partition count mismatch")

// migrate applies ms in tx and returns P.
func (s *Store) migrate(ctx context.Context, tx pgx.Tx, ms []migration) (int, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, s.n.lockKey); err != nil {
		return 0, fmt.Errorf("take the migration lock: %w", err)
	}
	// Statements without arguments run with the simple protocol, which
	// accepts several statements at once.
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
	// database even when the schema exists, so look first.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.opts.Schema).Scan(&exists); err != nil {
		return 0, fmt.Errorf("look for the schema: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.n.schema); err != nil {
			return 0, fmt.Errorf("create schema: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.n.migrations+` (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return 0, fmt.Errorf("create the migrations table: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT version FROM `+s.n.migrations)
	if err != nil {
		return 0, fmt.Errorf("read applied migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("read applied migrations: %w", err)
	}
	for _, v := range applied {
		if int(v) > len(ms) {
			return 0, fmt.Errorf("the tables are at migration %d, newer than this program knows (%d): upgrade the program", v, len(ms))
		}
	}
	for _, m := range ms {
		if slices.Contains(applied, int32(m.version)) {
			continue
		}
		sql, err := s.n.render(m.sql)
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.n.migrations+` (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			return 0, fmt.Errorf("record migration %d: %w", m.version, err)
		}
	}

	// The partition count and its lease rows, created once.
	want := cmp.Or(s.opts.Partitions, outbox.DefaultPartitions)
	var stored int
	err = tx.QueryRow(ctx, `SELECT partitions FROM `+s.n.meta).Scan(&stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.n.meta+` (partitions) VALUES ($1)`, want); err != nil {
			return 0, fmt.Errorf("record the partition count: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.n.leases+` (partition) SELECT generate_series(0, $1::integer - 1) ON CONFLICT DO NOTHING`, want); err != nil {
			return 0, fmt.Errorf("create the lease rows: %w", err)
		}
		stored = want
	case err != nil:
		return 0, fmt.Errorf("read the partition count: %w", err)
	case s.opts.Partitions != 0 && s.opts.Partitions != stored:
		return 0, fmt.Errorf("postgres: migrate: Options.Partitions is %d but the outbox in schema %q, prefix %q was created with %d partitions; the count cannot change: set Partitions to %d (or 0) or use another TablePrefix: %w",
			s.opts.Partitions, s.opts.Schema, s.opts.TablePrefix, stored, stored, errPartitionsMismatch)
	}
	return stored, nil
}
