package cli_test

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/mysql"
)

// writeMySQL commits msgs into the outbox at the mysql:// URL u.
func writeMySQL(t *testing.T, u string, msgs []outbox.Message) {
	t.Helper()
	ctx := t.Context()
	s, err := mysql.Open(ctx, u, mysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// From migrate to messages on NATS with a mysql:// store: migrate
// (--dry-run, --print-sql, again), relay, status, dlq; the password, read
// from a file, is never printed.
func TestMySQLStoreCommands(t *testing.T) {
	t.Parallel()
	u := testenv.MySQLURL(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := pu.User.Password()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The password only in the file.
	pu.User = url.User(pu.User.Username())
	pu.RawQuery = "password_file=" + url.QueryEscape(pwFile)
	store := pu.String()

	r := mustRun(t, nil, "migrate", "--dry-run", "--store", store, "--partitions", "8")
	if !strings.Contains(r.stdout, "0001_init") {
		t.Fatalf("dry run before the tables exist: %v", r)
	}
	r = mustRun(t, nil, "migrate", "--store", store, "--partitions", "8")
	if want := "created the outbox tables (8 partitions): applied 0001_init\n"; r.stdout != want {
		t.Fatalf("first migrate printed %q; want %q", r.stdout, want)
	}
	if r = mustRun(t, nil, "migrate", "--store", store); r.stdout != "outbox tables are up to date (8 partitions)\n" {
		t.Fatalf("second migrate printed %q", r.stdout)
	}
	r = mustRun(t, nil, "migrate", "--print-sql", "--store", "mysql://", "--table-prefix", "ob", "--partitions", "16")
	for _, want := range []string{"CREATE TABLE IF NOT EXISTS `ob_messages`", "INSERT INTO `ob_meta` (singleton, partitions, created_at) VALUES (1, 16,", "(15);"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--print-sql lacks %q:\n%s", want, r.stdout)
		}
	}

	writeMySQL(t, u, messages("orders.created", 200, 20))
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	b := start(t, nil, "relay", "--store", store, "--broker", ns.ClientURL(), "--http-addr", "", "--poll-interval", "50ms")
	poll(t, "the backlog to reach the stream", func() bool { return streamMsgs(t, st) >= 200 })
	poll(t, "status to show an empty outbox", func() bool { return statusJSON(t, store).Outstanding == 0 })
	r = mustRun(t, nil, "status", "--store", store)
	if !regexp.MustCompile(`(?m)^outstanding\s+0$`).MatchString(r.stdout) {
		t.Fatalf("status text:\n%s", r.stdout)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	if got := streamMsgs(t, st); got != 200 {
		t.Fatalf("stream holds %d messages, want 200", got)
	}
	if r := mustRun(t, nil, "dlq", "list", "--store", store); r.stdout != "no dead letters\n" {
		t.Fatalf("dlq list:\n%s", r.stdout)
	}

	// A wrong password fails with exit 1, without printing it.
	bad := strings.Replace(u, ":"+password+"@", ":hunter22xyz@", 1)
	r = run(t, nil, "status", "--store", bad)
	if r.code != 1 || strings.Contains(r.stderr+r.stdout, "hunter22xyz") || strings.Contains(r.stderr+r.stdout, password) {
		t.Fatalf("status with a wrong password: %v", r)
	}
	// Usage errors: exit 2, naming what to change.
	for _, tc := range []struct{ args, want []string }{
		{[]string{"status", "--store", "mysql://u:pw@127.0.0.1:1/"}, []string{"--store", "names no database"}},
		{[]string{"status", "--store", "mysql://u:pw@127.0.0.1:1/app", "--schema", "x"}, []string{"--schema", "drop --schema"}},
		{[]string{"status", "--store", "mysql://u@127.0.0.1:1/app?tls_cert=/x"}, []string{"tls_cert and tls_key go together"}},
	} {
		r := run(t, nil, tc.args...)
		if r.code != 2 {
			t.Errorf("outbox %s: exit %d, want 2: %v", strings.Join(tc.args, " "), r.code, r)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("outbox %s: stderr lacks %q: %v", strings.Join(tc.args, " "), w, r)
			}
		}
	}
}
