package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxrelay/outbox/internal/servers"
)

// MariaDBOptions is [servers.MariaDBOptions], which configures
// [MariaDBServer].
type MariaDBOptions = servers.MariaDBOptions

// sharedMariaDB is the test process's MariaDB server.
var sharedMariaDB lazy[*servers.MariaDBServer]

// MySQLServerURL returns the URL (mysql://outbox:PASSWORD@127.0.0.1:PORT/,
// no database) of the test process's shared MariaDB server, started on
// first use from the system's binaries (Debian's mariadb-server) and
// stopped by Main. If it cannot be started (the binaries are not
// installed: the error says how to install them), it calls t.Fatalf. Most
// tests want MySQLURL.
func MySQLServerURL(t testing.TB) string {
	t.Helper()
	requireMain(t)
	s, err := sharedMariaDB.get(func() (*servers.MariaDBServer, error) {
		ctx, cancel := context.WithTimeout(context.Background(), sharedPostgresStartTimeout)
		defer cancel()
		var logf func(string, ...any)
		if testing.Verbose() {
			logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		}
		return servers.StartMariaDB(ctx, servers.MariaDBOptions{Logf: logf})
	})
	if err != nil {
		t.Fatalf("testenv: shared MariaDB server: %v", err)
	}
	return s.URL()
}

// MySQLURL returns the URL (mysql://outbox:PASSWORD@127.0.0.1:PORT/DBNAME)
// of a new, empty database owned by this test on the shared MariaDB server
// (see MySQLServerURL), named after the test plus a random suffix and
// dropped by t.Cleanup.
func MySQLURL(t testing.TB) string {
	t.Helper()
	server := MySQLServerURL(t)
	name := randomName(t.Name(), 64)
	if err := execMySQL(server, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := execMySQL(server, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// MariaDBServer starts a MariaDB server of this test alone (durable
// settings, a restart, a crash), stopped by t.Cleanup.
func MariaDBServer(t testing.TB, opts MariaDBOptions) *servers.MariaDBServer {
	t.Helper()
	requireMain(t)
	ctx, cancel := context.WithTimeout(context.Background(), sharedPostgresStartTimeout)
	defer cancel()
	s, err := servers.StartMariaDB(ctx, opts)
	if err != nil {
		t.Fatalf("testenv: MariaDB server: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("testenv: stop MariaDB: %v", err)
		}
	})
	return s
}

// ExecMySQL runs query on its own connection to rawURL (a mysql:// URL),
// calling t.Fatalf if it fails.
func ExecMySQL(t testing.TB, rawURL, query string) {
	t.Helper()
	if err := execMySQL(rawURL, query); err != nil {
		t.Fatalf("testenv: %s: %v", query, err)
	}
}

// execMySQL runs query on its own connection to rawURL.
func execMySQL(rawURL, query string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if len(u.Path) > 1 {
		cfg.DBName = u.Path[1:]
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
	defer cancel()
	_, err = db.ExecContext(ctx, query)
	return err
}
