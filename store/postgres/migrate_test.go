package postgres

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMigrateReportsCreatedThenUpToDate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, testenv.PostgresDSN(t), Options{Schema: "fresh", Partitions: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pending, err := s.PendingMigrations(ctx)
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	want := len(ms)
	if err != nil || len(pending) != want {
		t.Fatalf("dry run on an empty database: %v, %v; want %d migrations", pending, err, want)
	}
	var exists bool
	if err := s.Pool().QueryRow(ctx, `SELECT to_regclass('fresh.outbox_migrations') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("the dry run created tables (%v, %v)", exists, err)
	}
	rep, err := s.MigrateWithReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Created || len(rep.Applied) != want || rep.Partitions != 6 || !rep.Applied[2].Concurrent || rep.Applied[0].Concurrent {
		t.Fatalf("first migrate: %+v; want created, %d applied, the third (an index on the outbox) concurrent", rep, want)
	}
	rep, err = s.MigrateWithReport(ctx)
	if err != nil || rep.Created || len(rep.Applied) != 0 || rep.Partitions != 6 {
		t.Fatalf("second migrate: %+v, %v; want nothing applied", rep, err)
	}
	if pending, err := s.PendingMigrations(ctx); err != nil || len(pending) != 0 {
		t.Fatalf("dry run after migrating: %v, %v; want none", pending, err)
	}
}

// beforeTxidIndex migrates a store, then removes migration 3 (the txid
// index), as if the tables had been created by an older version.
func beforeTxidIndex(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	s := b.opts.Schema
	for _, q := range []string{
		`DROP INDEX ` + pgx.Identifier{s, "outbox_messages_txid_idx"}.Sanitize(),
		`DELETE FROM ` + pgx.Identifier{s, "outbox_migrations"}.Sanitize() + ` WHERE version = 3`,
	} {
		if _, err := b.store.Pool().Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// indexValid reports whether the txid index exists and is valid, and its
// definition.
func indexValid(t *testing.T, b *bundle) (exists, valid bool, def string) {
	t.Helper()
	err := b.store.Pool().QueryRow(b.ctx, `SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'outbox_messages_txid_idx'`, b.opts.Schema).Scan(&valid, &def)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return true, valid, def
}

// TestMigrateIndexUpgradeDoesNotBlockWriters: while the upgrade that adds
// the txid index waits for a transaction that wrote to the outbox, other
// writers still commit. A plain CREATE INDEX would hold a SHARE lock
// request that queues every later writer behind it.
func TestMigrateIndexUpgradeDoesNotBlockWriters(t *testing.T) {
	t.Parallel()
	b := beforeTxidIndex(t)
	if err := b.write(t, outbox.Message{Topic: "before", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if pending, err := b.store.PendingMigrations(b.ctx); err != nil || len(pending) != 1 || pending[0].Version != 3 || !pending[0].Concurrent {
		t.Fatalf("dry run: %v, %v; want only 0003, concurrent", pending, err)
	}
	// A writer whose transaction stays open while the index is built.
	open, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.Background())
	if err := b.store.Writer().Write(b.ctx, open, outbox.Message{Topic: "open", Key: "k"}); err != nil {
		t.Fatal(err)
	}

	type result struct {
		rep MigrateReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := b.store.MigrateWithReport(b.ctx)
		done <- result{rep, err}
	}()
	// Wait until the index build waits for the open transaction.
	waitFor(t, "CREATE INDEX CONCURRENTLY to wait for the open writer", func() bool {
		var waiting bool
		err := b.store.Pool().QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE '%CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	// Another writer commits meanwhile. lock_timeout turns being blocked
	// into an error instead of a hang.
	err = pgx.BeginFunc(b.ctx, b.store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
			return err
		}
		return b.store.Writer().Write(b.ctx, tx, outbox.Message{Topic: "during", Key: "k"})
	})
	if err != nil {
		t.Fatalf("a writer was blocked by the index upgrade: %v", err)
	}
	if err := open.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.rep.Created || len(r.rep.Applied) != 1 || r.rep.Applied[0].Version != 3 {
		t.Fatalf("upgrade report %+v; want 0003 applied", r.rep)
	}
	if exists, valid, _ := indexValid(t, b); !exists || !valid {
		t.Fatalf("txid index exists %v, valid %v after the upgrade", exists, valid)
	}
	if n := b.count(t, "_messages"); n != 3 {
		t.Fatalf("%d messages, want 3", n)
	}
}

// TestMigrateDropsInvalidIndexOfFailedBuild: a concurrent build that failed
// left an invalid index under the name the migration uses; IF NOT EXISTS
// alone would keep it. Migrate drops it and builds the index again.
func TestMigrateDropsInvalidIndexOfFailedBuild(t *testing.T) {
	t.Parallel()
	b := beforeTxidIndex(t)
	// Two messages of one key share a partition: a unique index on
	// partition fails, concurrently, and leaves an invalid index.
	if err := b.write(t, outbox.Message{Topic: "a", Key: "k"}, outbox.Message{Topic: "a", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	_, err := b.store.Pool().Exec(b.ctx, `CREATE UNIQUE INDEX CONCURRENTLY outbox_messages_txid_idx ON `+
		pgx.Identifier{b.opts.Schema, "outbox_messages"}.Sanitize()+` (partition)`)
	if err == nil {
		t.Fatal("the unique concurrent build succeeded; want it to fail on duplicates")
	}
	if exists, valid, _ := indexValid(t, b); !exists || valid {
		t.Fatalf("after the failed build: exists %v, valid %v; want an invalid index", exists, valid)
	}
	rep, err := b.store.MigrateWithReport(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.DroppedInvalid) != 1 || rep.DroppedInvalid[0] != "outbox_messages_txid_idx" {
		t.Fatalf("report %+v; want the invalid index dropped", rep)
	}
	exists, valid, def := indexValid(t, b)
	if !exists || !valid || !strings.Contains(def, "(partition, txid)") || strings.Contains(def, "UNIQUE") {
		t.Fatalf("after migrate: exists %v, valid %v, %s; want the valid txid index", exists, valid, def)
	}
}

// TestMigrationSQLAppliedByPsql applies the --print-sql output with psql, as
// a DBA or a migration tool would, and checks that the result equals what
// Migrate makes and that Migrate then has nothing to do.
// On the ring layout too (layout=ring): the printed SQL makes the ring
// that Migrate makes on an empty database.
func TestMigrationSQLAppliedByPsql(t *testing.T) {
	t.Parallel()
	for _, layout := range []Layout{LayoutPlain, LayoutRing} {
		t.Run(string(layout), func(t *testing.T) {
			t.Parallel()
			testMigrationSQLAppliedByPsql(t, layout)
		})
	}
}

func testMigrationSQLAppliedByPsql(t *testing.T, layout Layout) {
	ctx := t.Context()
	psql := filepath.Join(postgresBinDir(t), "psql")
	dsn := testenv.PostgresDSN(t)
	opts := Options{Schema: "printed", TablePrefix: "ob", Partitions: 12, Layout: layout}
	text, err := MigrationSQL(opts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "CREATE INDEX CONCURRENTLY") || !strings.Contains(text, "run outside a transaction") {
		t.Fatalf("printed SQL lacks the concurrent index and its note:\n%s", text)
	}
	f := filepath.Join(t.TempDir(), "outbox.sql")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", f).CombinedOutput(); err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	s, err := Open(ctx, dsn, Options{Schema: "printed", TablePrefix: "ob"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rep, err := s.MigrateWithReport(ctx)
	if err != nil || len(rep.Applied) != 0 || rep.Partitions != 12 || rep.ConvertedToRing || rep.Layout != layout {
		t.Fatalf("migrate after the printed SQL: %+v, %v; want nothing to do, 12 partitions, layout %s", rep, err, layout)
	}
	direct, err := Open(ctx, dsn, Options{Schema: "direct", TablePrefix: "ob", Partitions: 12, Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	shape := func(schema string) string {
		var out string
		err := s.Pool().QueryRow(ctx, `SELECT string_agg(x, E'\n' ORDER BY x) FROM (
  SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || replace(coalesce(column_default, ''), $1 || '.', '') AS x
    FROM information_schema.columns WHERE table_schema = $1
  UNION ALL SELECT replace(indexdef, $1 || '.', '') FROM pg_indexes WHERE schemaname = $1
  UNION ALL SELECT 'leases ' || count(*) FROM `+pgx.Identifier{"printed", "ob_leases"}.Sanitize()+` WHERE $1 = 'printed'
  UNION ALL SELECT 'leases ' || count(*) FROM `+pgx.Identifier{"direct", "ob_leases"}.Sanitize()+` WHERE $1 = 'direct'
) q`, schema).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if p, d := shape("printed"), shape("direct"); p != d {
		t.Fatalf("tables from the printed SQL differ from Migrate's:\nprinted:\n%s\ndirect:\n%s", p, d)
	}
}

// postgresBinDir finds psql next to the server binaries testenv uses.
func postgresBinDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(testenv.PostgresBinDirEnv); d != "" {
		return d
	}
	for _, d := range []string{"/usr/lib/postgresql/15/bin"} {
		if _, err := os.Stat(filepath.Join(d, "psql")); err == nil {
			return d
		}
	}
	p, err := exec.LookPath("psql")
	if err != nil {
		t.Fatalf("psql not found: install it with `apt-get install -y postgresql-client-15`")
	}
	return filepath.Dir(p)
}

// TestWriteSQLDrivers writes through database/sql with pgx's stdlib and with
// lib/pq, with values that need escaping in an array literal.
func TestWriteSQLDrivers(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var db *sql.DB
			if driver == "pgx" {
				db = stdlib.OpenDBFromPool(b.store.Pool())
			} else {
				var err error
				if db, err = sql.Open("postgres", b.dsn); err != nil {
					t.Fatal(err)
				}
			}
			defer db.Close()
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			msgs := []outbox.Message{
				{Topic: "a.b", Key: `quo"te\back{,}`, Payload: []byte{0, 1, 0xff, '"', '\\'}, Headers: map[string]string{"h": `v"\`, "NULL": "null"}},
				{Topic: "a.b", Key: "NULL", Payload: nil},
				{Topic: "a.c", Payload: []byte("plain")},
			}
			if err := b.store.Writer().WriteSQL(b.ctx, tx, msgs...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			recs := b.all(t)
			if len(recs) != 3 {
				t.Fatalf("%d records, want 3", len(recs))
			}
			byKey := map[string]outbox.Record{}
			for _, r := range recs {
				byKey[r.Key+"|"+r.Topic] = r
			}
			r0 := byKey[msgs[0].Key+"|a.b"]
			if string(r0.Payload) != string(msgs[0].Payload) || r0.Headers["h"] != `v"\` || r0.Headers["NULL"] != "null" {
				t.Fatalf("first message came back as %+v", r0)
			}
			if r1 := byKey["NULL|a.b"]; len(r1.Payload) != 0 || r1.Headers != nil {
				t.Fatalf("second message came back as %+v", r1)
			}
			r2 := byKey["|a.c"]
			if string(r2.Payload) != "plain" || r2.CreatedAt.IsZero() || r2.Partition < 0 {
				t.Fatalf("third message came back as %+v", r2)
			}
		})
	}
}

// waitFor polls cond until it holds, failing after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
