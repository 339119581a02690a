package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/servers"
)

// PostgresBinDirEnv is [servers.PostgresBinDirEnv]: the environment variable
// naming the directory of the PostgreSQL server binaries.
const PostgresBinDirEnv = servers.PostgresBinDirEnv

// PostgresOptions is [servers.PostgresOptions], which configures
// [StartPostgres].
type PostgresOptions = servers.PostgresOptions

const (
	// sharedPostgresStartTimeout bounds the start-up (initdb included) of the
	// shared server.
	sharedPostgresStartTimeout = 2 * time.Minute
	// dbOpTimeout bounds creating and dropping a test database.
	dbOpTimeout = time.Minute
)

// StartPostgres is [servers.StartPostgres]: it starts a standalone,
// throwaway PostgreSQL server, registered for [Main] to stop. Within tests,
// use PostgresDSN or PostgresServerDSN instead.
func StartPostgres(ctx context.Context, opts PostgresOptions) (dsn string, stop func() error, err error) {
	return servers.StartPostgres(ctx, opts)
}

// StartPostgresStandby is [servers.StartPostgresStandby]: it starts a hot
// standby of the server at primaryDSN (one started with StartPostgres),
// registered for [Main] to stop.
func StartPostgresStandby(ctx context.Context, primaryDSN string, opts PostgresOptions) (dsn string, stop func() error, err error) {
	return servers.StartPostgresStandby(ctx, primaryDSN, opts)
}

// sharedPostgres is the test process's PostgreSQL server; its value is the
// DSN of the postgres database.
var sharedPostgres lazy[string]

// PostgresServerDSN returns the DSN of the postgres database of the test
// process's shared PostgreSQL server, for tools and benchmarks that create
// their own objects (and clean them up). Most tests want PostgresDSN.
//
// The server is started on first use, once per test process, and stopped by
// Main, which must run the package's tests. If the server cannot be started
// (for instance because the PostgreSQL binaries are not installed; the error
// says how to install them), PostgresServerDSN calls t.Fatalf.
// With go test -v, start-up timings are printed to stderr.
func PostgresServerDSN(t testing.TB) string {
	t.Helper()
	requireMain(t)
	dsn, err := sharedPostgres.get(func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), sharedPostgresStartTimeout)
		defer cancel()
		var logf func(string, ...any)
		if testing.Verbose() {
			logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		}
		dsn, _, err := servers.StartPostgres(ctx, servers.PostgresOptions{Logf: logf})
		return dsn, err
	})
	if err != nil {
		t.Fatalf("testenv: shared PostgreSQL server: %v", err)
	}
	return dsn
}

// PostgresDSN returns the DSN
// (postgres://postgres@127.0.0.1:PORT/DBNAME?sslmode=disable) of a new, empty
// database owned by this test, on the shared server (see PostgresServerDSN).
// Each call creates another database, named after the test plus a random
// suffix (matching ^[a-z][a-z0-9_]{0,62}$). The database is dropped, even if
// connections to it are still open, by t.Cleanup. Connections the test opens
// must be closed by the test (goroutine leaks fail Main).
func PostgresDSN(t testing.TB) string {
	t.Helper()
	serverDSN := PostgresServerDSN(t)
	name := randomName(t.Name(), 63)
	ident := pgx.Identifier{name}.Sanitize()

	if err := execAdmin(serverDSN, "CREATE DATABASE "+ident); err != nil {
		t.Fatalf("servers: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := execAdmin(serverDSN, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("servers: drop database %s: %v", name, err)
		}
	})

	u, err := url.Parse(serverDSN)
	if err != nil {
		t.Fatalf("servers: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// execAdmin runs sql on its own connection to dsn.
func execAdmin(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// PostgresSSL starts a throwaway PostgreSQL server of this test with
// ssl=on, a server certificate from pki (valid for 127.0.0.1 and
// localhost), client certificates checked against pki's CA, and hba as the
// lines of pg_hba.conf (user postgres may still connect from 127.0.0.1
// without a password). It returns the host:port of the server and the DSN of
// its postgres database for administration; the server is stopped by
// t.Cleanup.
func PostgresSSL(t testing.TB, pki *PKI, hba ...string) (hostPort, adminDSN string) {
	t.Helper()
	requireMain(t)
	server := pki.Server("postgres")
	ctx, cancel := context.WithTimeout(context.Background(), sharedPostgresStartTimeout)
	defer cancel()
	dsn, stop, err := servers.StartPostgres(ctx, servers.PostgresOptions{
		SSL: &servers.PostgresSSL{CertPEM: server.CertPEM, KeyPEM: server.KeyPEM, CAPEM: pki.CAPEM},
		HBA: hba,
	})
	if err != nil {
		t.Fatalf("testenv: PostgreSQL with SSL: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("testenv: stop PostgreSQL: %v", err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host, dsn
}

// ExecPostgres runs sql on its own connection to dsn, calling t.Fatalf if
// it fails.
func ExecPostgres(t testing.TB, dsn, sql string) {
	t.Helper()
	if err := execAdmin(dsn, sql); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}
