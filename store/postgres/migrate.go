package postgres

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
		"{{parked}}", n.parked,
		"{{parked_idx}}", n.parkedIdx,
	)
	out := r.Replace(sql)
	if i := strings.Index(out, "{{"); i >= 0 {
		end := min(len(out), i+40)
		return "", fmt.Errorf("postgres: unknown placeholder in migration: %q", out[i:end])
	}
	return out, nil
}

// noTransaction is the first line of a migration that must run outside a
// transaction (CREATE INDEX CONCURRENTLY); such a file holds one statement.
const noTransaction = "-- outbox:no-transaction"

// concurrentIndexRe finds the index a no-transaction migration builds.
var concurrentIndexRe = regexp.MustCompile(`(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?("(?:[^"]|"")+"|\w+)\s+ON`)

// inTransaction reports whether m runs in a transaction.
func (m migration) inTransaction() bool { return !strings.HasPrefix(m.sql, noTransaction) }

// Migration describes one embedded schema change.
type Migration struct {
	// Version is its number, from 1.
	Version int
	// Name is its file name without the number and extension (txid_index).
	Name string
	// Concurrent reports a migration that builds an index with CREATE
	// INDEX CONCURRENTLY, outside a transaction, so that it does not block
	// writers of an existing table.
	Concurrent bool
}

func (m Migration) String() string {
	s := fmt.Sprintf("%04d_%s", m.Version, m.Name)
	if m.Concurrent {
		s += " (CREATE INDEX CONCURRENTLY)"
	}
	return s
}

// MigrateReport is what Migrate did.
type MigrateReport struct {
	// Created reports that the tables did not exist before.
	Created bool
	// Applied lists the migrations applied, in order; empty when the tables
	// were up to date.
	Applied []Migration
	// DroppedInvalid lists the invalid indexes, left by a failed concurrent
	// build, that Migrate dropped before building them again.
	DroppedInvalid []string
	// Partitions is P.
	Partitions int
	// Layout is the outbox table's layout after Migrate (capture table).
	Layout Layout
	// ConvertedToRing reports that this Migrate turned the table into the
	// ring layout (Options.Layout LayoutRing; see ring.go).
	ConvertedToRing bool
}

// Migrate creates or upgrades the outbox tables: it applies the embedded
// migrations not yet recorded in <prefix>_migrations. It is idempotent and
// may run concurrently from many processes: an advisory lock serialises
// them. See MigrateWithReport.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateWithReport(ctx)
	return err
}

// MigrateWithReport is Migrate, reporting what it did.
//
// Each run of consecutive ordinary migrations is applied in one
// transaction, with its record. A migration that adds an index to an
// existing table runs outside any transaction with CREATE INDEX
// CONCURRENTLY, so that writers are not blocked while the index is built;
// if an earlier concurrent build of that index failed and left it invalid,
// the invalid index is dropped (DROP INDEX CONCURRENTLY) and built again.
//
// The first Migrate fixes P (Options.Partitions, default
// outbox.DefaultPartitions) in <prefix>_meta and creates one lease row per
// partition. A later Migrate with a non-zero Options.Partitions different
// from the stored P fails, naming both values, and changes nothing.
func (s *Store) MigrateWithReport(ctx context.Context) (MigrateReport, error) {
	if err := s.check("migrate"); err != nil {
		return MigrateReport{}, err
	}
	ms, err := migrations()
	if err != nil {
		return MigrateReport{}, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return MigrateReport{}, fmt.Errorf("postgres: migrate: %w", err)
	}
	defer conn.Release()
	rep, err := s.migrate(ctx, conn.Conn(), ms)
	if err != nil {
		if errors.Is(err, errPartitionsMismatch) {
			return rep, err
		}
		return rep, fmt.Errorf("postgres: migrate schema %q, prefix %q: %w", s.opts.Schema, s.opts.TablePrefix, err)
	}
	s.partitions.Store(int64(rep.Partitions))
	s.ringLayout.Store(rep.Layout == LayoutRing) // also when Migrate converted it
	return rep, nil
}

// migrateLockPoll is how often migrate tries the advisory lock while another
// process migrates.
const migrateLockPoll = 100 * time.Millisecond

// lock takes the session-level migration lock on conn. It polls
// pg_try_advisory_lock rather than waiting in pg_advisory_lock, so that no
// statement holding a snapshot waits on it: CREATE INDEX CONCURRENTLY in
// the session holding the lock waits for every older snapshot to go.
func (s *Store) lock(ctx context.Context, conn *pgx.Conn) (unlock func(), err error) {
	t := time.NewTicker(migrateLockPoll)
	defer t.Stop()
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, s.n.lockKey).Scan(&ok); err != nil {
			return nil, fmt.Errorf("take the migration lock: %w", err)
		}
		if ok {
			return func() {
				// A failure leaves the lock to the connection's end.
				_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, s.n.lockKey)
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the migration lock held by another process: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// migrate applies ms on conn.
func (s *Store) migrate(ctx context.Context, conn *pgx.Conn, ms []migration) (MigrateReport, error) {
	var rep MigrateReport
	unlock, err := s.lock(ctx, conn)
	if err != nil {
		return rep, err
	}
	defer unlock()
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
	// database even when the schema exists, so look first.
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.opts.Schema).Scan(&exists); err != nil {
		return rep, fmt.Errorf("look for the schema: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.n.schema); err != nil {
			return rep, fmt.Errorf("create schema: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, s.migrationsTableSQL()); err != nil {
		return rep, fmt.Errorf("create the migrations table: %w", err)
	}
	pending, err := s.pending(ctx, conn, ms)
	if err != nil {
		return rep, err
	}
	rep.Created = len(pending) > 0 && pending[0].version == 1
	for i := 0; i < len(pending); {
		m := pending[i]
		if !m.inTransaction() {
			dropped, err := s.applyConcurrent(ctx, conn, m)
			if err != nil {
				return rep, err
			}
			rep.DroppedInvalid = append(rep.DroppedInvalid, dropped...)
			rep.Applied = append(rep.Applied, m.info())
			i++
			continue
		}
		j := i
		for j < len(pending) && pending[j].inTransaction() {
			j++
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, m := range pending[i:j] {
				if err := s.apply(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
		for _, m := range pending[i:j] {
			rep.Applied = append(rep.Applied, m.info())
		}
		i = j
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rep.Partitions, err = s.fixPartitions(ctx, tx)
		return err
	})
	if err != nil {
		return rep, err
	}
	rep.Layout, rep.ConvertedToRing, err = s.migrateLayout(ctx, conn, rep.Created)
	return rep, err
}

func (m migration) info() Migration {
	return Migration{Version: m.version, Name: m.name, Concurrent: !m.inTransaction()}
}

func (s *Store) migrationsTableSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.n.migrations + ` (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
}

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// pending returns the migrations of ms not recorded as applied. The
// migrations table must exist.
func (s *Store) pending(ctx context.Context, q querier, ms []migration) ([]migration, error) {
	rows, err := q.Query(ctx, `SELECT version FROM `+s.n.migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	for _, v := range applied {
		if int(v) > len(ms) {
			return nil, fmt.Errorf("the tables are at migration %d, newer than this program knows (%d): upgrade the program", v, len(ms))
		}
	}
	var out []migration
	for _, m := range ms {
		if !slices.Contains(applied, int32(m.version)) {
			out = append(out, m)
		}
	}
	return out, nil
}

// apply runs an ordinary migration and records it, in tx.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, m migration) error {
	sql, err := s.n.render(m.sql)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
	}
	return s.record(ctx, tx, m)
}

func (s *Store) record(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, m migration) error {
	if _, err := q.Exec(ctx, `INSERT INTO `+s.n.migrations+` (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
		return fmt.Errorf("record migration %d: %w", m.version, err)
	}
	return nil
}

// applyConcurrent runs a no-transaction migration (one CREATE INDEX
// CONCURRENTLY) on conn, first dropping the index it builds if a failed
// earlier build left it invalid, and records it. It returns the indexes
// dropped.
func (s *Store) applyConcurrent(ctx context.Context, conn *pgx.Conn, m migration) ([]string, error) {
	dropped, err := s.buildConcurrently(ctx, conn, m)
	if err != nil {
		return dropped, err
	}
	return dropped, s.record(ctx, conn, m)
}

// buildConcurrently is applyConcurrent without the record: it builds the
// index of m (CREATE INDEX CONCURRENTLY), first dropping it if a failed
// earlier build left it invalid, and returns the indexes dropped.
func (s *Store) buildConcurrently(ctx context.Context, conn *pgx.Conn, m migration) ([]string, error) {
	sql, err := s.n.render(m.sql)
	if err != nil {
		return nil, err
	}
	match := concurrentIndexRe.FindStringSubmatch(sql)
	if match == nil {
		return nil, fmt.Errorf("migration %d (%s) runs outside a transaction but builds no index CONCURRENTLY", m.version, m.name)
	}
	index := strings.ReplaceAll(strings.Trim(match[1], `"`), `""`, `"`)
	var dropped []string
	var valid bool
	err = conn.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, s.opts.Schema, index).Scan(&valid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("migration %d (%s): look for index %s: %w", m.version, m.name, index, err)
	case !valid:
		// A concurrent build that failed (or was cancelled) leaves an
		// invalid index behind, which IF NOT EXISTS would keep.
		qualified := pgx.Identifier{s.opts.Schema, index}.Sanitize()
		if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+qualified); err != nil {
			return nil, fmt.Errorf("migration %d (%s): drop the invalid index %s left by a failed concurrent build: %w", m.version, m.name, index, err)
		}
		dropped = append(dropped, index)
	}
	// Exec without arguments uses the simple protocol: one statement, no
	// implicit transaction around it.
	if _, err := conn.Exec(ctx, sql); err != nil {
		return dropped, fmt.Errorf("migration %d (%s): %w (an invalid index %s may be left behind; the next migrate drops and rebuilds it)", m.version, m.name, err, index)
	}
	return dropped, nil
}

// fixPartitions creates the partition count and its lease rows once, or
// checks the stored count against Options.Partitions, and returns P.
func (s *Store) fixPartitions(ctx context.Context, tx pgx.Tx) (int, error) {
	want := cmp.Or(s.opts.Partitions, outbox.DefaultPartitions)
	var stored int
	err := tx.QueryRow(ctx, `SELECT partitions FROM `+s.n.meta).Scan(&stored)
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

var errPartitionsMismatch = errors.New("partition count mismatch")

// PendingMigrations returns the migrations Migrate would apply, without
// changing anything (a dry run). It does not take the migration lock.
func (s *Store) PendingMigrations(ctx context.Context) ([]Migration, error) {
	if err := s.check("migrate"); err != nil {
		return nil, err
	}
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.n.migrations).Scan(&exists); err != nil {
		return nil, fmt.Errorf("postgres: look for the migrations table: %w", err)
	}
	pending := ms
	if exists {
		if pending, err = s.pending(ctx, s.pool, ms); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	out := make([]Migration, len(pending))
	for i, m := range pending {
		out[i] = m.info()
	}
	return out, nil
}

// MigrationSQL returns the SQL that Migrate runs on an empty database for
// opts (schema, table prefix, partition count), for a migration tool
// (goose, Flyway, atlas) or a DBA: the schema, the migrations table, every
// migration with its record, and the partition count with its lease rows.
// Each migration starts with a comment naming it; one that must run outside
// a transaction (CREATE INDEX CONCURRENTLY) says so. Applying it and then
// running Migrate is a no-op.
func MigrationSQL(opts Options) (string, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return "", err
	}
	ms, err := migrations()
	if err != nil {
		return "", err
	}
	n := newNames(opts)
	s := &Store{opts: opts, n: n}
	var b strings.Builder
	p := cmp.Or(opts.Partitions, outbox.DefaultPartitions)
	fmt.Fprintf(&b, "-- outbox tables: schema %s, table prefix %s, %d partitions.\n", n.schema, pgx.Identifier{opts.TablePrefix}.Sanitize(), p)
	fmt.Fprintf(&b, "-- Generated by `outbox migrate --print-sql`; apply in order.\n\n")
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n\n%s;\n", n.schema, s.migrationsTableSQL())
	for _, m := range ms {
		sql, err := n.render(m.sql)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n-- migration %04d_%s", m.version, m.name)
		if !m.inTransaction() {
			b.WriteString(": run outside a transaction (CREATE INDEX CONCURRENTLY; goose: -- +goose NO TRANSACTION; Flyway: executeInTransaction=false)")
		}
		b.WriteString("\n")
		b.WriteString(strings.TrimRight(sql, "\n; ") + ";\n")
		fmt.Fprintf(&b, "INSERT INTO %s (version, name) VALUES (%d, %s);\n", n.migrations, m.version, quoteLiteral(m.name))
	}
	fmt.Fprintf(&b, "\n-- the partition count, fixed once, and one lease row per partition\n")
	fmt.Fprintf(&b, "INSERT INTO %s (partitions) VALUES (%d);\n", n.meta, p)
	fmt.Fprintf(&b, "INSERT INTO %s (partition) SELECT generate_series(0, %d) ON CONFLICT DO NOTHING;\n", n.leases, p-1)
	if s.wantLayout(true) == LayoutRing {
		s.rn = newRingNames(opts)
		b.WriteString(s.ringCreateSQL())
	}
	return b.String(), nil
}

// quoteLiteral quotes a migration name (letters, digits, '_') as an SQL
// string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
