package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded, numbered schema change.
type migration struct {
	version int
	name    string // file name without the number and extension
	sql     string // with placeholders
}

func (m migration) String() string { return fmt.Sprintf("%04d_%s", m.version, m.name) }

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration file %s does not start with a version number", name)
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: strings.TrimSuffix(rest, ".sql"), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := range ms {
		if ms[i].version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1, 2, 3…: %s is number %d", ms[i].name, i+1)
		}
	}
	return ms, nil
}

// expand replaces the placeholders of a migration by the quoted names.
func (n names) expand(sql string) string {
	return strings.NewReplacer(
		"{{meta}}", n.meta,
		"{{messages}}", n.messages,
		"{{dead_letters}}", n.deadLetters,
		"{{leases}}", n.leases,
		"{{relays}}", n.relays,
	).Replace(sql)
}

// statements splits a migration into its statements: each ends with a
// semicolon at the end of a line. Comment lines are dropped.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(sql) {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "--") || (t == "" && cur.Len() == 0) {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

func (s *Store) migrationsTableSQL() string {
	return "CREATE TABLE IF NOT EXISTS " + s.n.migrations +
		" (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
}

// MigrateReport is what Migrate did.
type MigrateReport struct {
	// Created reports that the tables did not exist before.
	Created bool
	// Applied lists the migrations applied, in order (0001_init).
	Applied []string
	// Partitions is P.
	Partitions int
}

// migrateLockWait bounds the wait for another process's migration.
const migrateLockWait = 5 * time.Minute

// Migrate creates or upgrades the outbox tables. See MigrateWithReport.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateWithReport(ctx)
	return err
}

// MigrateWithReport applies the embedded migrations not yet recorded in
// <prefix>_migrations, and reports what it did. It is idempotent and may
// run concurrently from many processes: a named lock (GET_LOCK)
// serialises them. MySQL commits each DDL statement at once, so a
// migration is not one transaction: each of its statements can run again
// (CREATE TABLE IF NOT EXISTS), and one that failed half-way is completed
// by the next Migrate. Later migrations that add an index to an existing
// table do it online (ALGORITHM=INPLACE, LOCK=NONE: writers go on).
//
// The first Migrate fixes P (Options.Partitions, default
// outbox.DefaultPartitions) in <prefix>_meta and creates one lease row per
// partition, in one transaction. A later Migrate with a non-zero
// Options.Partitions different from the stored P fails, naming both
// values, and changes nothing.
func (s *Store) MigrateWithReport(ctx context.Context) (MigrateReport, error) {
	var rep MigrateReport
	if err := s.check("migrate"); err != nil {
		return rep, err
	}
	ms, err := migrations()
	if err != nil {
		return rep, fmt.Errorf("mysql: migrate: %w", err)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return rep, s.wrap("migrate", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(SHA1(CONCAT(DATABASE(), '.', ?)), ?)", s.opts.TablePrefix, int(migrateLockWait.Seconds())).Scan(&got); err != nil {
		return rep, s.wrap("migrate: take the migration lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return rep, fmt.Errorf("mysql: migrate: another process has been migrating prefix %q for %v; try again", s.opts.TablePrefix, migrateLockWait)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(SHA1(CONCAT(DATABASE(), '.', ?)))", s.opts.TablePrefix)

	pending, err := s.pending(ctx, conn, ms)
	if err != nil {
		return rep, s.wrap("migrate", err)
	}
	rep.Created = len(pending) == len(ms)
	for _, m := range pending {
		for _, stmt := range statements(s.n.expand(m.sql)) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return rep, s.wrap("migrate: apply "+m.String(), err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+s.n.migrations+" (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))", m.version, m.name); err != nil {
			return rep, s.wrap("migrate", err)
		}
		rep.Applied = append(rep.Applied, m.String())
	}
	p, err := s.fixPartitions(ctx, conn)
	if err != nil {
		return rep, err
	}
	rep.Partitions = p
	s.partitions.Store(int64(p))
	return rep, nil
}

// pending returns the migrations not yet applied, creating the migrations
// table if needed.
func (s *Store) pending(ctx context.Context, conn *sql.Conn, ms []migration) ([]migration, error) {
	if _, err := conn.ExecContext(ctx, s.migrationsTableSQL()); err != nil {
		return nil, err
	}
	var current int
	if err := conn.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM "+s.n.migrations).Scan(&current); err != nil {
		return nil, err
	}
	if current > len(ms) {
		return nil, fmt.Errorf("the database is at schema version %d, newer than this program's %d: upgrade the program", current, len(ms))
	}
	return ms[current:], nil
}

// fixPartitions records P and the lease rows on first creation, or checks
// Options.Partitions against the stored P.
func (s *Store) fixPartitions(ctx context.Context, conn *sql.Conn) (int, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, s.wrap("migrate", err)
	}
	defer tx.Rollback()
	stored, err := readPartitions(ctx, tx, s.n)
	switch {
	case errors.Is(err, errNotMigrated):
		p := s.opts.Partitions
		if p == 0 {
			p = outbox.DefaultPartitions
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.n.meta+" (singleton, partitions, created_at) VALUES (1, ?, UTC_TIMESTAMP(6))", p); err != nil {
			return 0, s.wrap("migrate", err)
		}
		for lo := 0; lo < p; lo += 1000 {
			n := min(1000, p-lo)
			args := make([]any, n)
			for i := range n {
				args[i] = lo + i
			}
			if _, err := tx.ExecContext(ctx, "INSERT IGNORE INTO "+s.n.leases+" (part) VALUES "+strings.TrimSuffix(strings.Repeat("(?), ", n), ", "), args...); err != nil {
				return 0, s.wrap("migrate", err)
			}
		}
		if err := tx.Commit(); err != nil {
			return 0, s.wrap("migrate", err)
		}
		return p, nil
	case err != nil:
		return 0, s.wrap("migrate", err)
	case s.opts.Partitions != 0 && s.opts.Partitions != stored:
		return 0, fmt.Errorf("mysql: migrate: Options.Partitions is %d but the outbox tables with prefix %q were created with %d partitions; P is fixed at migration: set Partitions to 0 or %d, or use a new TablePrefix",
			s.opts.Partitions, s.opts.TablePrefix, stored, stored)
	}
	return stored, nil
}

// PendingMigrations lists the migrations Migrate would apply, changing
// nothing (outbox migrate --dry-run). Tables that do not exist yet mean
// every migration.
func (s *Store) PendingMigrations(ctx context.Context) ([]string, error) {
	if err := s.check("pending migrations"); err != nil {
		return nil, err
	}
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	var current int
	err = s.db.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM "+s.n.migrations).Scan(&current)
	if missingTables(err) {
		current, err = 0, nil
	}
	if err != nil {
		return nil, s.wrap("pending migrations", err)
	}
	if current > len(ms) {
		return nil, fmt.Errorf("mysql: the database is at schema version %d, newer than this program's %d: upgrade the program", current, len(ms))
	}
	var out []string
	for _, m := range ms[current:] {
		out = append(out, m.String())
	}
	return out, nil
}

// MigrationSQL returns the SQL that creates the outbox tables for opts (TablePrefix,
// Partitions) and records them as migrated, for tools that apply SQL
// themselves (outbox migrate --print-sql): running Migrate afterwards is a
// no-op. It connects to nothing.
func MigrationSQL(opts Options) (string, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return "", err
	}
	ms, err := migrations()
	if err != nil {
		return "", err
	}
	s := newStore(nil, opts)
	p := opts.Partitions
	if p == 0 {
		p = outbox.DefaultPartitions
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- outbox tables, prefix %q, %d partitions (MySQL 8.0+ / MariaDB 10.6+).\n", opts.TablePrefix, p)
	b.WriteString(s.migrationsTableSQL() + ";\n\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s\n", m)
		for _, st := range statements(s.n.expand(m.sql)) {
			b.WriteString(st + ";\n\n")
		}
		fmt.Fprintf(&b, "INSERT INTO %s (version, name, applied_at) VALUES (%d, '%s', UTC_TIMESTAMP(6));\n\n", s.n.migrations, m.version, m.name)
	}
	fmt.Fprintf(&b, "INSERT INTO %s (singleton, partitions, created_at) VALUES (1, %d, UTC_TIMESTAMP(6));\n", s.n.meta, p)
	// Explicit rows: MySQL 8 stops a recursive CTE at 1,000 rows by
	// default (cte_max_recursion_depth), and P may be up to 4,096.
	for lo := 0; lo < p; lo += 256 {
		fmt.Fprintf(&b, "INSERT INTO %s (part) VALUES ", s.n.leases)
		for i := lo; i < min(p, lo+256); i++ {
			if i > lo {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(%d)", i)
		}
		b.WriteString(";\n")
	}
	return b.String(), nil
}
