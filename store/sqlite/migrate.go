package sqlite

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

	"github.com/outboxrelay/outbox"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded, numbered schema change.
type migration struct {
	version int
	name    string
	sql     string // with placeholders
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration file %s does not start with a version number", name)
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
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
		"{{pending_idx}}", n.pendingIdx,
		"{{published_idx}}", n.publishedIdx,
		"{{failed_idx}}", n.failedIdx,
		"{{dead_key_idx}}", n.deadKeyIdx,
		"{{dead_topic_idx}}", n.deadTopicIdx,
	).Replace(sql)
}

// Migrate creates or upgrades the outbox tables: it applies, in one
// transaction, the embedded migrations not yet recorded in
// <prefix>_migrations, and on first creation records P (Options.Partitions,
// default outbox.DefaultPartitions) and one lease row per partition. It is
// idempotent and safe to run concurrently from several processes (the write
// lock serialises them). If the tables exist with a different P than a
// non-zero Options.Partitions, it fails and changes nothing.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.check("migrate"); err != nil {
		return err
	}
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	var p int
	err = s.inTx(ctx, func(c *sql.Conn) error {
		if _, err := c.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+s.n.migrations+
			" (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT"); err != nil {
			return err
		}
		var current int
		if err := c.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM "+s.n.migrations).Scan(&current); err != nil {
			return err
		}
		if current > len(ms) {
			return fmt.Errorf("the database is at schema version %d, newer than this program's %d: upgrade the program", current, len(ms))
		}
		for _, m := range ms[current:] {
			if _, err := c.ExecContext(ctx, s.n.expand(m.sql)); err != nil {
				return fmt.Errorf("apply %s: %w", m.name, err)
			}
			if _, err := c.ExecContext(ctx, "INSERT INTO "+s.n.migrations+" (version, name, applied_at) VALUES (?, ?, ?)",
				m.version, m.name, nanos(s.now())); err != nil {
				return err
			}
		}
		stored, err := readPartitions(ctx, c, s.n)
		switch {
		case errors.Is(err, errNotMigrated):
			p = s.opts.Partitions
			if p == 0 {
				p = outbox.DefaultPartitions
			}
			if _, err := c.ExecContext(ctx, "INSERT INTO "+s.n.meta+" (singleton, partitions, created_at) VALUES (1, ?, ?)", p, nanos(s.now())); err != nil {
				return err
			}
			_, err := c.ExecContext(ctx, "WITH RECURSIVE n(p) AS (SELECT 0 UNION ALL SELECT p + 1 FROM n WHERE p + 1 < ?) "+
				"INSERT INTO "+s.n.leases+" (partition) SELECT p FROM n", p)
			return err
		case err != nil:
			return err
		case s.opts.Partitions != 0 && s.opts.Partitions != stored:
			return fmt.Errorf("Options.Partitions is %d but the outbox tables with prefix %q were created with %d partitions; P is fixed at migration: set Partitions to 0 or %d, or use a new TablePrefix",
				s.opts.Partitions, s.opts.TablePrefix, stored, stored)
		}
		p = stored
		return nil
	})
	if err != nil {
		return s.wrap("migrate", err)
	}
	s.partitions.Store(int64(p))
	return nil
}
