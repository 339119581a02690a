package cli_test

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMigrateSaysWhatItDid(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	r := mustRun(t, nil, "migrate", "--dry-run", "--store", dsn, "--partitions", "8")
	if !strings.Contains(r.stdout, "would apply 7 migration(s):") || !strings.Contains(r.stdout, "0003_txid_index (CREATE INDEX CONCURRENTLY)") {
		t.Fatalf("dry run before the tables exist: %v", r)
	}
	r = mustRun(t, nil, "migrate", "--store", dsn, "--partitions", "8")
	if want := "created the outbox tables (8 partitions): applied 0001_init, 0002_txid, 0003_txid_index (CREATE INDEX CONCURRENTLY), 0004_dead_letter_seq, 0005_dead_letter_key_idx (CREATE INDEX CONCURRENTLY), 0006_dead_letter_topic_idx (CREATE INDEX CONCURRENTLY), 0007_wal_parked\n"; r.stdout != want {
		t.Fatalf("first migrate printed %q; want %q", r.stdout, want)
	}
	r = mustRun(t, nil, "migrate", "--store", dsn)
	if r.stdout != "outbox tables are up to date (8 partitions)\n" {
		t.Fatalf("second migrate printed %q", r.stdout)
	}
	r = mustRun(t, nil, "migrate", "--dry-run", "--store", dsn)
	if r.stdout != "outbox tables are up to date: nothing to apply\n" {
		t.Fatalf("dry run after migrating printed %q", r.stdout)
	}
}

func TestMigratePrintSQL(t *testing.T) {
	t.Parallel()
	// No --store: nothing is contacted.
	r := mustRun(t, nil, "migrate", "--print-sql", "--schema", "billing", "--table-prefix", "ob", "--partitions", "16")
	for _, want := range []string{
		`CREATE SCHEMA IF NOT EXISTS "billing";`,
		`CREATE TABLE "billing"."ob_messages"`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "ob_messages_txid_idx" ON "billing"."ob_messages"`,
		"run outside a transaction",
		`INSERT INTO "billing"."ob_meta" (partitions) VALUES (16);`,
		"generate_series(0, 15)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--print-sql lacks %q", want)
		}
	}
	if strings.Contains(r.stdout, "{{") {
		t.Errorf("--print-sql left a placeholder:\n%s", r.stdout)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--print-sql", "--dry-run"}, "--print-sql and --dry-run do not go together"},
		{[]string{"migrate", "--print-sql", "--store", "sqlite:///tmp/x.db"}, "--print-sql prints the PostgreSQL migrations; sqlite:// stores have none"},
		{[]string{"migrate", "--print-sql", "--schema", "bad-name"}, "--schema"},
	} {
		if r := run(t, nil, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("outbox %s: want exit 2 with %q; got %v", strings.Join(tc.args, " "), tc.want, r)
		}
	}
}
