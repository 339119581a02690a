package cli_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// pgSSL starts a PostgreSQL server with ssl=on: user app logs in with a
// password over TLS only, user relay_cert with a client certificate, and
// each owns a database of its name. It returns the server's host:port.
func pgSSL(t *testing.T, pki *testenv.PKI, appPassword string) string {
	t.Helper()
	hostPort, admin := testenv.PostgresSSL(t, pki,
		"hostssl all app 127.0.0.1/32 scram-sha-256",
		"hostssl all relay_cert 127.0.0.1/32 cert",
	)
	testenv.ExecPostgres(t, admin, "CREATE ROLE app LOGIN PASSWORD '"+appPassword+"'")
	testenv.ExecPostgres(t, admin, "CREATE ROLE relay_cert LOGIN")
	testenv.ExecPostgres(t, admin, "CREATE DATABASE app OWNER app")
	testenv.ExecPostgres(t, admin, "CREATE DATABASE relay_cert OWNER relay_cert")
	return hostPort
}

func TestStorePostgresVerifyFull(t *testing.T) {
	t.Parallel()
	const password, wrong = "app-pw-8c2f5e1d7a", "app-wrong-3b9d0e6f"
	secrets := []string{password, wrong}
	pki := testenv.NewPKI(t, "pg")
	hostPort := pgSSL(t, pki, password)
	dsn := func(user, pw, query string) string {
		u := url.URL{Scheme: "postgres", Host: hostPort, Path: "/" + user, RawQuery: query}
		if pw != "" {
			u.User = url.UserPassword(user, pw)
		} else {
			u.User = url.User(user)
		}
		return u.String()
	}
	verifyFull := "sslmode=verify-full&sslrootcert=" + url.QueryEscape(pki.CAFile)
	foreign := testenv.NewPKI(t, "foreign").Client("relay_cert")

	t.Run("password over verify-full relays", func(t *testing.T) {
		store := dsn("app", password, verifyFull)
		r := mustRun(t, nil, "migrate", "--store", store)
		noSecret(t, r.stdout+r.stderr, secrets...)
		write(t, store, messages("secure.test", 20, 5))
		ns := testenv.NATS(t)
		count := natsStream(t, ns.ClientURL())
		b := start(t, nil, "relay", "--store", store, "--broker", ns.ClientURL(), "--http-addr", "", "--log-level", "debug", "--poll-interval", "50ms")
		poll(t, "the messages to reach NATS", func() bool {
			if code, done := b.exited(); done {
				t.Fatalf("relay exited %d:\n%s", code, b.stderr)
			}
			return count() >= 20
		})
		if code := b.stop(t); code != 0 {
			t.Fatalf("relay exited %d:\n%s", code, b.stderr)
		}
		noSecret(t, b.stdout.String()+b.stderr.String(), secrets...)
		r = mustRun(t, nil, "status", "--store", store)
		noSecret(t, r.stdout+r.stderr, secrets...)
	})
	t.Run("client certificate", func(t *testing.T) {
		client := pki.Client("relay_cert")
		store := dsn("relay_cert", "", verifyFull+"&sslcert="+url.QueryEscape(client.CertFile)+"&sslkey="+url.QueryEscape(client.KeyFile))
		if r := mustRun(t, nil, "migrate", "--store", store); !strings.Contains(r.stdout, "partitions") {
			t.Fatalf("%v", r)
		}
	})
	for _, tc := range []struct{ name, store, want string }{
		{"wrong password", dsn("app", wrong, verifyFull), `password authentication failed for user "app"`},
		{"unknown CA", dsn("app", password, "sslmode=verify-full&sslrootcert="+url.QueryEscape(testenv.NewPKI(t, "other").CAFile)), "certificate signed by unknown authority"},
		{"no TLS", dsn("app", password, "sslmode=disable"), "no encryption"},
		{"client certificate of another CA", dsn("relay_cert", "", verifyFull+"&sslcert="+url.QueryEscape(foreign.CertFile)+"&sslkey="+url.QueryEscape(foreign.KeyFile)), "certificate"},
	} {
		t.Run(tc.name+" refused", func(t *testing.T) {
			r := run(t, nil, "migrate", "--store", tc.store)
			if r.code != 1 || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("want exit 1 and one line holding %q; got %v", tc.want, r)
			}
			noSecret(t, r.stdout+r.stderr, secrets...)
		})
	}
}

// TestStorePostgresPGVariables sets PG* variables (for pgx, which reads
// the process environment), so it cannot run in parallel.
func TestStorePostgresPGVariables(t *testing.T) {
	const password = "app-pw-env-41d7c0a9e2"
	pki := testenv.NewPKI(t, "pgenv")
	hostPort := pgSSL(t, pki, password)
	t.Setenv("PGSSLMODE", "verify-full")
	t.Setenv("PGSSLROOTCERT", pki.CAFile)
	t.Setenv("PGPASSWORD", password)
	r := mustRun(t, nil, "migrate", "--store", fmt.Sprintf("postgres://app@%s/app", hostPort))
	noSecret(t, r.stdout+r.stderr, password)
	t.Setenv("PGSSLROOTCERT", testenv.NewPKI(t, "other").CAFile)
	r = run(t, nil, "status", "--store", fmt.Sprintf("postgres://app@%s/app", hostPort))
	if r.code != 1 || !strings.Contains(r.stderr, "certificate signed by unknown authority") {
		t.Fatalf("PGSSLROOTCERT with another CA: %v", r)
	}
}
