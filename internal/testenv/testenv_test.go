package testenv_test

import (
	"context"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// check fails the test now if err is not nil.
func check(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// errorContains reports (with t.Errorf) whether err's message lacks any of
// the wanted substrings.
func errorContains(t testing.TB, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("got no error, want one containing %q", wants)
		return
	}
	for _, want := range wants {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// connect opens a connection to dsn, closed by t.Cleanup.
func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	check(t, err, "connect")
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryString(t testing.TB, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	check(t, conn.QueryRow(context.Background(), sql, args...).Scan(&s), sql)
	return s
}

func TestPostgresServer(t *testing.T) {
	start := time.Now()
	dsn := testenv.PostgresServerDSN(t)
	t.Logf("shared server available after %v: %s", time.Since(start).Round(time.Millisecond), dsn)

	u, err := url.Parse(dsn)
	check(t, err, "parse DSN")
	if u.Scheme != "postgres" || u.User.String() != "postgres" || u.Hostname() != "127.0.0.1" ||
		u.Port() == "" || u.Path != "/postgres" || u.RawQuery != "sslmode=disable" {
		t.Errorf("DSN %s, want postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable", dsn)
	}

	conn := connect(t, dsn)
	for setting, want := range map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": "",
		"fsync":                   "off",
		"synchronous_commit":      "on",
		"max_connections":         "300",
		"shared_buffers":          "128MB",
		"server_encoding":         "UTF8",
	} {
		if got := queryString(t, conn, "SELECT current_setting($1)", setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	t.Log(queryString(t, conn, "SELECT version()"))

	if again := testenv.PostgresServerDSN(t); again != dsn {
		t.Errorf("second PostgresServerDSN = %s, want the same server %s", again, dsn)
	}
}

func TestPostgresDSNIsolation(t *testing.T) {
	for _, value := range []string{"a", "b"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			dsn := testenv.PostgresDSN(t)
			conn := connect(t, dsn)
			ctx := context.Background()

			u, err := url.Parse(dsn)
			check(t, err, "parse DSN")
			db := strings.TrimPrefix(u.Path, "/")
			if !regexp.MustCompile(`^postgresdsnisolation_` + value + `_[a-z0-9]{8}$`).MatchString(db) {
				t.Errorf("database name %q does not derive from the test name", db)
			}
			if got := queryString(t, conn, "SELECT current_database()"); got != db {
				t.Errorf("connected to database %s, want %s", got, db)
			}

			// Same table name in both databases, different contents.
			_, err = conn.Exec(ctx, "CREATE TABLE items (v text NOT NULL)")
			check(t, err, "create table")
			_, err = conn.Exec(ctx, "INSERT INTO items VALUES ($1)", value)
			check(t, err, "insert")
			rows, err := conn.Query(ctx, "SELECT v FROM items")
			check(t, err, "select")
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			check(t, err, "select")
			if !slices.Equal(got, []string{value}) {
				t.Errorf("items = %q, want only %q", got, value)
			}
		})
	}
}

func TestPostgresDSNDroppedDespiteOpenConnection(t *testing.T) {
	var db string
	t.Run("owner", func(t *testing.T) {
		// Registered before PostgresDSN, so it runs after the database is
		// dropped: the connection is still open during the drop.
		var conn *pgx.Conn
		t.Cleanup(func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		})
		dsn := testenv.PostgresDSN(t)
		var err error
		conn, err = pgx.Connect(context.Background(), dsn)
		check(t, err, "connect")
		db = queryString(t, conn, "SELECT current_database()")
	})
	if db == "" {
		t.Fatal("subtest failed")
	}

	admin := connect(t, testenv.PostgresServerDSN(t))
	var n int
	check(t, admin.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n), "count databases")
	if n != 0 {
		t.Errorf("database %s still exists after the test's cleanup", db)
	}
}

func TestNATS(t *testing.T) {
	s := testenv.NATS(t)
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") {
		t.Errorf("ClientURL = %s, want nats://127.0.0.1:PORT", s.ClientURL())
	}

	nc, err := nats.Connect(s.ClientURL())
	check(t, err, "connect")
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	check(t, err, "JetStream")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := testenv.Name(t)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{name + ".>"},
		Storage:  jetstream.FileStorage,
	})
	check(t, err, "create stream")

	for i, msg := range []string{"one", "two"} {
		ack, err := js.Publish(ctx, name+".events", []byte(msg))
		check(t, err, "publish")
		if ack.Stream != name || ack.Sequence != uint64(i+1) {
			t.Errorf("ack = %+v, want stream %s sequence %d", ack, name, i+1)
		}
	}
	info, err := stream.Info(ctx)
	check(t, err, "stream info")
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2", info.State.Msgs)
	}
	got, err := stream.GetMsg(ctx, 2)
	check(t, err, "get message")
	if string(got.Data) != "two" {
		t.Errorf("message 2 = %q, want %q", got.Data, "two")
	}
}

func TestName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)
	seen := map[string]bool{}
	for _, sub := range []string{
		"simple",
		"With Spaces & Symbols/and/sub-tests#01",
		"9starts_with_digit",
		strings.Repeat("very_long_name_", 10),
		"ÄÖÜ",
	} {
		t.Run(sub, func(t *testing.T) {
			for range 3 {
				name := testenv.Name(t)
				if !valid.MatchString(name) || !strings.HasPrefix(name, "name_") {
					t.Errorf("Name = %q, want a match of %s starting with name_", name, valid)
				}
				if seen[name] {
					t.Errorf("Name returned %q twice", name)
				}
				seen[name] = true
			}
		})
	}
	for testName, want := range map[string]string{
		"TestName/simple":                   `^name_simple_[a-z0-9]{8}$`,
		"Test":                              `^test_[a-z0-9]{8}$`,
		"Test9Lives":                        `^t9lives_[a-z0-9]{8}$`,
		"BenchmarkRelay":                    `^relay_[a-z0-9]{8}$`,
		"TestX/" + strings.Repeat("y", 100): `^x_y{30}_[a-z0-9]{8}$`,
	} {
		if got := testenv.Name(&namedTB{TB: t, name: testName}); !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("Name for %q = %q, want a match of %s", testName, got, want)
		}
	}
}

// namedTB is a testing.TB with another name.
type namedTB struct {
	testing.TB
	name string
}

func (n *namedTB) Name() string { return n.name }
