package servers

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mariadbInstallHint tells how to install the server binaries.
const mariadbInstallHint = "apt-get install -y mariadb-server"

// MariaDBUser is the user StartMariaDB creates, with every privilege, and
// puts in the URL it returns (with a random password).
const MariaDBUser = "outbox"

const (
	// mariadbStartTimeout bounds how long one start attempt may take to
	// accept connections.
	mariadbStartTimeout = 2 * time.Minute
	// mariadbStopTimeout is how long a normal shutdown (SIGTERM) may take
	// before the server is killed.
	mariadbStopTimeout = 30 * time.Second
	// mariadbPortAttempts is how many ports are tried when the picked one
	// turns out to be taken.
	mariadbPortAttempts = 5
)

// mariadbFixedSettings are set by StartMariaDB and cannot be overridden.
var mariadbFixedSettings = []string{"port", "bind-address", "socket", "datadir", "skip-grant-tables", "user"}

// MariaDBOptions configures StartMariaDB.
type MariaDBOptions struct {
	// Dir is the base directory under which the server's own directory is
	// created; default os.TempDir().
	Dir string
	// Durable sets the settings under which a commit survives a power loss:
	// innodb_flush_log_at_trx_commit=1 and, with the binary log on
	// (log_bin), sync_binlog=1; the defaults write the log at each commit
	// but flush it once a second (innodb_flush_log_at_trx_commit=2, no
	// binary log), like the PostgreSQL test servers' fsync=off.
	Durable bool
	// Settings are extra server options (mariadbd --NAME=VALUE), applied
	// after the defaults. port, bind-address, socket, datadir, user and
	// skip-grant-tables cannot be set.
	Settings map[string]string
	// Logf, if not nil, receives progress messages, such as start-up timings.
	Logf func(format string, args ...any)
}

// MariaDBServer is a server started by [StartMariaDB].
type MariaDBServer struct {
	port     int
	password string
	socket   string
	proc     *Proc
	stop     func() error
}

// URL returns the server's mysql:// URL for user [MariaDBUser], without a
// database: mysql://outbox:PASSWORD@127.0.0.1:PORT/.
func (s *MariaDBServer) URL() string { return mariadbURL(s.port, s.password, "") }

// URLFor returns the server's URL for database db.
func (s *MariaDBServer) URLFor(db string) string { return mariadbURL(s.port, s.password, db) }

// Port returns the server's TCP port on 127.0.0.1.
func (s *MariaDBServer) Port() int { return s.port }

// PID returns the server process's ID.
func (s *MariaDBServer) PID() int { return s.proc.PID() }

// Stop shuts the server down and removes its directory. It is idempotent.
func (s *MariaDBServer) Stop() error { return s.stop() }

func mariadbURL(port int, password, db string) string {
	u := url.URL{
		Scheme: "mysql",
		User:   url.UserPassword(MariaDBUser, password),
		Host:   "127.0.0.1:" + strconv.Itoa(port),
		Path:   "/" + db,
	}
	return u.String()
}

// StartMariaDB starts a standalone, throwaway MariaDB server from the
// system's binaries (Debian's mariadb-server: mariadb-install-db and
// mariadbd), for tests and for `outbox bench`.
//
// The server gets a fresh data directory (mariadb-install-db --no-defaults)
// in a new directory under opts.Dir, reads no option file, listens on
// 127.0.0.1 only, on a free port, and on a Unix socket in its directory.
// Grant tables are on: a user [MariaDBUser] with a random password and every
// privilege is created through the socket by root, and the URL of that user
// is what the server offers (see [MariaDBServer.URL]). When the current
// process runs as root, the server runs as system user mysql. It is killed
// if the current process dies.
//
// Stop (idempotent, registered with [AtExit] so that [StopAll] stops the
// server if the caller has not) shuts it down by its PID (SIGTERM, then
// SIGKILL after 30 s) and removes its directory. ctx bounds the start-up.
func StartMariaDB(ctx context.Context, opts MariaDBOptions) (_ *MariaDBServer, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, k := range mariadbFixedSettings {
		for have := range opts.Settings {
			if strings.ReplaceAll(have, "_", "-") == k {
				return nil, fmt.Errorf("servers: mariadb setting %s is managed by StartMariaDB and cannot be set", k)
			}
		}
	}
	installDB, mariadbd, err := mariadbBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := UserCredential("mysql")
	if err != nil {
		return nil, err
	}
	dir, err := NewServerDir(opts.Dir, "mariadb", cred)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	dataDir := filepath.Join(dir, "data")
	t0 := time.Now()
	err = RunProc(ctx, ProcConfig{
		Name: "mariadb-install-db",
		Path: installDB,
		Args: []string{
			"--no-defaults",
			"--datadir=" + dataDir,
			"--auth-root-authentication-method=normal",
			"--skip-test-db",
			"--skip-name-resolve",
		},
		Dir:        dir,
		Credential: cred,
	})
	if err != nil {
		return nil, err
	}
	logf("servers: mariadb: mariadb-install-db %s in %v", dataDir, time.Since(t0).Round(time.Millisecond))

	settings := map[string]string{
		"innodb-flush-log-at-trx-commit": "2",
		"innodb-buffer-pool-size":        "128M",
		"innodb-log-file-size":           "128M",
		"max-connections":                "500",
		"skip-name-resolve":              "",
		"character-set-server":           "utf8mb4",
		"collation-server":               "utf8mb4_bin",
		"log-error":                      filepath.Join(dir, "error.log"),
		"pid-file":                       filepath.Join(dir, "mariadbd.pid"),
	}
	if opts.Durable {
		settings["innodb-flush-log-at-trx-commit"] = "1"
		settings["log-bin"] = filepath.Join(dir, "binlog")
		settings["server-id"] = "1"
		settings["sync-binlog"] = "1"
		settings["binlog-format"] = "ROW"
	}
	for k, v := range opts.Settings {
		settings[strings.ReplaceAll(k, "_", "-")] = v
	}
	password, err := randomPassword()
	if err != nil {
		return nil, err
	}
	socket := filepath.Join(dir, "mariadbd.sock")
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		t1 := time.Now()
		proc, err := startMariaDBD(ctx, mariadbd, dir, dataDir, socket, port, cred, settings, password)
		if err == nil {
			logf("servers: mariadb: pid %d ready on 127.0.0.1:%d in %v (%v with mariadb-install-db)",
				proc.PID(), port, time.Since(t1).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
			s := &MariaDBServer{port: port, password: password, socket: socket, proc: proc}
			s.stop = AtExit("mariadb", func() error {
				return errors.Join(proc.Stop(), os.RemoveAll(dir))
			})
			return s, nil
		}
		if proc == nil || attempt == mariadbPortAttempts || !mariadbPortTaken(proc, dir) {
			return nil, err
		}
		logf("servers: mariadb: port %d taken, retrying with another one", port)
	}
}

// startMariaDBD starts mariadbd and waits until the test user can connect
// over TCP, creating it through the socket first.
func startMariaDBD(ctx context.Context, bin, dir, dataDir, socket string, port int, cred *syscall.Credential, settings map[string]string, password string) (*Proc, error) {
	args := []string{
		"--no-defaults",
		"--datadir=" + dataDir,
		"--socket=" + socket,
		"--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1",
	}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		if v := settings[k]; v != "" {
			args = append(args, "--"+k+"="+v)
		} else {
			args = append(args, "--"+k)
		}
	}
	proc, err := StartProc(ProcConfig{
		Name:        "mariadbd",
		Path:        bin,
		Args:        args,
		Dir:         dir,
		Credential:  cred,
		StopSignal:  syscall.SIGTERM, // a normal shutdown
		StopTimeout: mariadbStopTimeout,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, mariadbStartTimeout)
	defer cancel()
	created := false
	err = proc.WaitReady(ctx, func(ctx context.Context) error {
		if !created {
			if err := createMariaDBUser(ctx, socket, password); err != nil {
				return err
			}
			created = true
		}
		return probeMariaDB(ctx, port, password, dataDir)
	})
	if err != nil {
		if tail := tailOf(filepath.Join(dir, "error.log"), 0, tailLines); tail != "" {
			err = fmt.Errorf("%w%s", err, formatTail(filepath.Join(dir, "error.log"), tail))
		}
		_ = proc.Stop()
		return proc, err
	}
	return proc, nil
}

// createMariaDBUser connects as root through the socket and creates the
// user the server's URL names.
func createMariaDBUser(ctx context.Context, socket, password string) error {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "unix"
	cfg.Addr = socket
	cfg.Timeout = 5 * time.Second
	db, err := openMySQL(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, q := range []string{
		"CREATE USER IF NOT EXISTS '" + MariaDBUser + "'@'127.0.0.1' IDENTIFIED BY '" + password + "'",
		"GRANT ALL PRIVILEGES ON *.* TO '" + MariaDBUser + "'@'127.0.0.1' WITH GRANT OPTION",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// probeMariaDB connects as the test user over TCP and checks that the
// server there runs on dataDir, not a server of another process that took
// the port.
func probeMariaDB(ctx context.Context, port int, password, dataDir string) error {
	cfg := mysql.NewConfig()
	cfg.User = MariaDBUser
	cfg.Passwd = password
	cfg.Net = "tcp"
	cfg.Addr = "127.0.0.1:" + strconv.Itoa(port)
	cfg.Timeout = 5 * time.Second
	db, err := openMySQL(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var got string
	if err := db.QueryRowContext(ctx, "SELECT @@datadir").Scan(&got); err != nil {
		return err
	}
	if filepath.Clean(got) != filepath.Clean(dataDir) {
		return fmt.Errorf("port is served by another server (data directory %s)", got)
	}
	return nil
}

func openMySQL(cfg *mysql.Config) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxIdleConns(0)
	return db, nil
}

// mariadbPortTaken reports whether the exited server failed because its
// port was in use.
func mariadbPortTaken(proc *Proc, dir string) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	tail := proc.Tail(20) + tailOf(filepath.Join(dir, "error.log"), 0, 20)
	return strings.Contains(tail, "Address already in use") || strings.Contains(tail, "Do you already have another")
}

func randomPassword() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("servers: mariadb: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// mariadbBinaries finds mariadb-install-db and mariadbd.
func mariadbBinaries() (installDB, server string, err error) {
	find := func(name string, dirs ...string) string {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0 {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		return ""
	}
	installDB = find("mariadb-install-db", "/usr/bin")
	server = find("mariadbd", "/usr/sbin")
	if installDB == "" || server == "" {
		return "", "", fmt.Errorf("servers: MariaDB server binaries (mariadb-install-db, mariadbd) not found in /usr/bin, /usr/sbin or $PATH; install them with `%s`", mariadbInstallHint)
	}
	return installDB, server, nil
}
