package testenv

import (
	"database/sql"
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// The shared server starts with grant tables on, and a test's database is
// usable by the URL's user over TCP; a durable server has the binary log
// and flushes it at each commit.
func TestMariaDB(t *testing.T) {
	u := MySQLURL(t)
	ExecMySQL(t, u, "CREATE TABLE t (x INT PRIMARY KEY)")
	ExecMySQL(t, u, "INSERT INTO t VALUES (1)")
	s := MariaDBServer(t, MariaDBOptions{Durable: true})
	ExecMySQL(t, s.URL(), "CREATE DATABASE d")
	ExecMySQL(t, s.URLFor("d"), "CREATE TABLE t (x INT PRIMARY KEY)")
	pu, _ := url.Parse(s.URL())
	cfg := mysql.NewConfig()
	cfg.User = pu.User.Username()
	cfg.Passwd, _ = pu.User.Password()
	cfg.Net, cfg.Addr = "tcp", pu.Host
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var logBin, syncBinlog, flush int
	if err := db.QueryRowContext(t.Context(), "SELECT @@log_bin, @@sync_binlog, @@innodb_flush_log_at_trx_commit").Scan(&logBin, &syncBinlog, &flush); err != nil {
		t.Fatal(err)
	}
	if logBin != 1 || syncBinlog != 1 || flush != 1 {
		t.Fatalf("durable server: log_bin %d, sync_binlog %d, innodb_flush_log_at_trx_commit %d; want 1, 1, 1", logBin, syncBinlog, flush)
	}
}
