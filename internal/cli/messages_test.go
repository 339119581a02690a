package cli_test

import (
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/outboxrelay/outbox/internal/cli"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestUnknownFlagSuggests: a mistyped flag gets "did you mean", as a
// mistyped configuration key does; a flag far from every other gets none.
func TestUnknownFlagSuggests(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--stor", "x"}, "did you mean --store?"},
		{[]string{"status", "--stroe", "x"}, "did you mean --store?"},
		{[]string{"dlq", "list", "--olderthan", "1h"}, "did you mean --older-than?"},
		{[]string{"relay", "--log-levle=debug"}, "did you mean --log-level?"},
	} {
		r := run(t, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("outbox %s: want exit 2 and %q: %v", strings.Join(c.args, " "), c.want, r)
		}
	}
	if r := run(t, nil, "relay", "--zzzzzzzz"); r.code != 2 || strings.Contains(r.stderr, "did you mean") {
		t.Errorf("outbox relay --zzzzzzzz: %v", r)
	}
}

// TestSQLiteStoreNotCreatedByReaders: status, dlq and console refuse a
// database file that does not exist (a typo would otherwise leave an empty
// file and report an empty outbox); migrate creates it and says so, and
// says "up to date" only the second time.
func TestSQLiteStoreNotCreatedByReaders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := "sqlite://" + filepath.Join(dir, "typo.db")
	for _, args := range [][]string{
		{"status", "--store", store},
		{"dlq", "list", "--store", store},
		{"console", "--store", store, "--http-addr", "127.0.0.1:0"},
	} {
		r := run(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "does not exist") || !strings.Contains(r.stderr, "outbox migrate --store "+store) {
			t.Errorf("outbox %s: want exit 2 naming the missing file: %v", strings.Join(args, " "), r)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the commands created %v", entries)
	}
	if r := mustRun(t, nil, "migrate", "--store", store); !strings.Contains(r.stdout, "created the outbox tables (64 partitions)") {
		t.Fatalf("first migrate: %v", r)
	}
	if r := mustRun(t, nil, "migrate", "--store", store); !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second migrate: %v", r)
	}
	mustRun(t, nil, "status", "--store", store)
}

// TestPrintConfigImpliedTLS: a tls:// or amqps:// broker, or a CA file,
// turns TLS on; --print-config says so instead of "broker-tls false".
func TestPrintConfigImpliedTLS(t *testing.T) {
	t.Parallel()
	for broker, want := range map[string]string{
		"tls://127.0.0.1:4222":       "implied by --broker tls://",
		"amqps://u@127.0.0.1:5671/":  "implied by --broker amqps://",
		"nats://127.0.0.1:4222":      "default",
		"kafka://127.0.0.1:9092?x=1": "default",
	} {
		r := mustRun(t, nil, "relay", "--print-config", "--store", "sqlite:///x.db", "--broker", broker)
		var line string
		for l := range strings.Lines(r.stdout) {
			if strings.HasPrefix(l, "broker-tls ") {
				line = strings.Join(strings.Fields(l), " ")
			}
		}
		wantValue := "true"
		if want == "default" {
			wantValue = "false"
		}
		if line != "broker-tls "+wantValue+" "+want {
			t.Errorf("--broker %s: broker-tls line %q; want value %s from %q", broker, line, wantValue, want)
		}
	}
	r := mustRun(t, nil, "relay", "--print-config", "--store", "sqlite:///x.db", "--broker", "nats://h:4222", "--broker-ca-file", "/etc/ca.pem")
	if !strings.Contains(r.stdout, "implied by --broker-ca-file") {
		t.Errorf("--broker-ca-file: %s", r.stdout)
	}
}

// TestWrongPostgresPasswordIsAnAuthFailure: with the default sslmode
// (prefer) and a server without TLS, pgx's first error is "server refused
// TLS connection"; the command must say that the password was refused.
func TestWrongPostgresPasswordIsAnAuthFailure(t *testing.T) {
	t.Parallel()
	const password, wrong = "app-pw-41c9e07b", "wrong-pw-90d2a6f3"
	srv := testenv.PostgresServer(t, testenv.PostgresOptions{HBA: []string{"host all app 127.0.0.1/32 scram-sha-256"}})
	testenv.ExecPostgres(t, srv.DSN(), "CREATE ROLE app LOGIN PASSWORD '"+password+"'")
	u, err := url.Parse(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("app", wrong)
	u.Path = "/postgres"
	u.RawQuery = "" // sslmode prefer, pgx's default: TLS is tried first and refused
	for _, args := range [][]string{{"migrate", "--store", u.String()}, {"status", "--store", u.String()}} {
		r := run(t, nil, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "PostgreSQL refused the password") || strings.Index(r.stderr, "refused the password") > strings.Index(r.stderr, "tls") && strings.Contains(r.stderr, "tls") {
			t.Errorf("outbox %s: want exit 1 saying first that the password was refused: %v", args[0], r)
		}
		noSecret(t, r.stdout+r.stderr, wrong)
	}
	u.User = url.UserPassword("app", password)
	u.Path = "/nosuchdb"
	if r := run(t, nil, "status", "--store", u.String()); r.code != 1 || !strings.Contains(r.stderr, "create the database, or name another in --store") {
		t.Errorf("a missing database: %v", r)
	}
}

// TestKafkaURLAtANonKafkaPort: kafka:// pointed at a NATS server says what
// answered, not franz-go's "invalid large response size 1229866575".
func TestKafkaURLAtANonKafkaPort(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	hostPort := strings.TrimPrefix(ns.ClientURL(), "nats://")
	dsn := migrated(t, 4)
	r := run(t, nil, "relay", "--store", dsn, "--broker", "kafka://"+hostPort, "--http-addr", "")
	if r.code != 1 || !strings.Contains(r.stderr, `does not speak Kafka (it began with "INFO": a NATS server, use nats://)`) {
		t.Fatalf("want exit 1 naming a NATS server: %v", r)
	}
}

// TestNATSPasswordFileNamedWhenRefused: a refused password names the flag
// it came from.
func TestNATSPasswordFileNamedWhenRefused(t *testing.T) {
	t.Parallel()
	s := testenv.NATSWith(t, server.Options{Username: "relay", Password: "right-pw-3e8a"})
	const wrong = "pw-wrong-5b2c90de"
	relayRefused(t, "the NATS server refused user relay and its password (--nats-user, --nats-password-file)", []string{wrong},
		"--broker", s.ClientURL(), "--nats-user", "relay", "--nats-password-file", secretFile(t, "pw", wrong))
}

// TestRelaysLiveOnceLeasesAreHeld: outbox_relays_live and
// outbox_leases_held follow the relay's leases at once, not at the next
// backlog refresh (here an hour away): an alert on relays_live < 1 would
// otherwise fire on every deploy. The empty outbox still has a backlog
// total series, at 0.
func TestRelaysLiveOnceLeasesAreHeld(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	b := start(t, nil, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", "127.0.0.1:0",
		"--backlog-interval", "1h", "--log-format", "json")
	addr := httpAddrFromLog(t, b)
	poll(t, "outbox_relays_live 1 with the relay's 4 leases", func() bool {
		if code, done := b.exited(); done {
			t.Fatalf("relay exited %d:\n%s", code, b.stderr)
		}
		fams, _ := scrape(t, addr)
		live, _ := gauge(fams, "outbox_relays_live", "", "")
		held, _ := gauge(fams, "outbox_leases_held", "", "")
		return live == 1 && held == 4
	})
	fams, _ := scrape(t, addr)
	if v, ok := gauge(fams, "outbox_backlog_messages", "", ""); !ok || v != 0 {
		t.Errorf("outbox_backlog_messages of an empty outbox = %v (exported %v), want 0", v, ok)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
}

// TestDemoLogLinesClearTheProgressLine: on a terminal the demo redraws one
// progress line; a log line (the relay's INFO lines) on the same screen
// clears it first instead of running into it. The summary says how its p99
// relates to the progress lines' "p99 so far".
func TestDemoLogLinesClearTheProgressLine(t *testing.T) {
	t.Parallel()
	var screen syncBuffer // stdout and stderr: one terminal
	code := cli.Run(t.Context(), []string{"demo", "--duration", "1s", "--rate", "200", "--workers", "2"},
		cli.Env{Stdout: &screen, Stderr: &screen, IsTerminal: func(io.Writer) bool { return true }})
	out := screen.String()
	if code != 0 {
		t.Fatalf("demo exited %d:\n%q", code, out)
	}
	logs := strings.Count(out, "level=INFO")
	if logs == 0 {
		t.Fatalf("the demo logged nothing at INFO; the test checks nothing:\n%q", out)
	}
	if cleared := strings.Count(out, "\r\x1b[Ktime="); cleared != logs {
		t.Errorf("%d of %d log lines clear the progress line first:\n%q", cleared, logs, out)
	}
	if !strings.Contains(out, "p99 so far") || !strings.Contains(out, "the progress lines showed the p99 of the messages consumed so far") {
		t.Errorf("the progress and the summary do not say which p99 they show:\n%s", out)
	}
}
