package servers

import (
	"context"
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

	"github.com/jackc/pgx/v5"
)

// PostgresBinDirEnv names an environment variable that, when set, is the
// directory holding the PostgreSQL server binaries (initdb, postgres). By
// default they are searched for in /usr/lib/postgresql/15/bin, then in the
// other /usr/lib/postgresql/*/bin (newest first), then in $PATH.
const PostgresBinDirEnv = "OUTBOX_PG_BINDIR"

// postgresInstallHint tells how to install the server binaries.
const postgresInstallHint = "apt-get install -y postgresql-15"

const (
	// postgresStartTimeout bounds how long one start attempt may take to
	// accept connections.
	postgresStartTimeout = 2 * time.Minute
	// postgresStopTimeout is how long a fast shutdown (SIGINT) may take
	// before the server is killed.
	postgresStopTimeout = 30 * time.Second
	// postgresPortAttempts is how many ports are tried when the picked one
	// turns out to be taken.
	postgresPortAttempts = 5
)

// postgresPort picks the port of the next server start attempt; tests
// replace it to simulate a port taken between FreePort and the server's bind.
var postgresPort = FreePort

// postgresFixedSettings are set by StartPostgres and cannot be overridden.
var postgresFixedSettings = []string{"listen_addresses", "port", "unix_socket_directories"}

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// Dir is the base directory under which the server's own directory
	// (data directory and log) is created; default os.TempDir(). When
	// running as root, Dir and its parents must be searchable by the
	// postgres user (mode 0755).
	Dir string
	// Settings are extra server settings (postgres -c NAME=VALUE), applied
	// after and overriding the defaults: fsync=off, synchronous_commit=on,
	// max_connections=300, shared_buffers=128MB. listen_addresses, port and
	// unix_socket_directories cannot be set.
	Settings map[string]string
	// Logf, if not nil, receives progress messages, such as start-up timings.
	Logf func(format string, args ...any)
	// SSL, if not nil, turns ssl on with its certificates.
	SSL *PostgresSSL
	// HBA, if not empty, replaces the lines of pg_hba.conf (such as
	// "hostssl all app 127.0.0.1/32 scram-sha-256"). A first line letting
	// user postgres in from 127.0.0.1 without a password is kept, for the
	// start-up check and administration.
	HBA []string
}

// PostgresSSL are the PEM certificates of a server with ssl=on.
type PostgresSSL struct {
	// CertPEM and KeyPEM are the server's certificate and key.
	CertPEM, KeyPEM []byte
	// CAPEM, if not empty, holds the CAs whose client certificates the
	// server accepts (ssl_ca_file), for cert authentication.
	CAPEM []byte
}

// StartPostgres starts a standalone, throwaway PostgreSQL server, for use
// outside of tests (such as the `outbox bench` command). Within tests, use
// testenv.PostgresDSN or testenv.PostgresServerDSN instead, which share one
// server per test process.
//
// The server runs a fresh cluster (initdb) in a new directory under
// opts.Dir, listens on 127.0.0.1 only, on a free port, without a Unix socket,
// and lets user postgres in without a password (trust). When the current
// process runs as root, the server runs as system user postgres. It is
// killed if the current process dies.
//
// StartPostgres returns the DSN of the server's postgres database
// (postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable) and a stop
// function that shuts the server down (fast shutdown, then SIGKILL after 30s)
// and removes its directory. stop is idempotent, safe for concurrent use,
// and registered with [AtExit], so that [StopAll] (which testenv.Main calls)
// stops the server if the caller has not. ctx bounds the start-up.
func StartPostgres(ctx context.Context, opts PostgresOptions) (dsn string, stop func() error, err error) {
	return startCluster(ctx, opts, "initdb", func(bindir, dataDir string) ProcConfig {
		return ProcConfig{
			Name: "initdb",
			Path: filepath.Join(bindir, "initdb"),
			Args: []string{
				"--pgdata", dataDir,
				"--username", "postgres",
				"--auth", "trust",
				"--encoding", "UTF8",
				"--no-locale",
				"--no-sync",
				"--no-instructions",
			},
		}
	})
}

// StartPostgresStandby starts a hot standby of the server at primaryDSN
// (one StartPostgres started, whose trust rules let user postgres
// replicate from 127.0.0.1): a copy of its cluster taken with pg_basebackup
// -R, so that it streams the primary's changes and accepts only read-only
// transactions. Everything else is as for StartPostgres, including the
// settings (a standby needs max_connections at least the primary's).
func StartPostgresStandby(ctx context.Context, primaryDSN string, opts PostgresOptions) (dsn string, stop func() error, err error) {
	return startCluster(ctx, opts, "pg_basebackup", func(bindir, dataDir string) ProcConfig {
		return ProcConfig{
			Name: "pg_basebackup",
			Path: filepath.Join(bindir, "pg_basebackup"),
			Args: []string{
				"--dbname", primaryDSN,
				"--pgdata", dataDir,
				"--write-recovery-conf",
				"--wal-method", "stream",
				"--checkpoint", "fast",
				"--no-sync",
				"--no-password",
			},
		}
	})
}

// startCluster creates a cluster in a new server directory with the
// command create returns (run as user postgres in that directory), then
// starts a server on it.
func startCluster(ctx context.Context, opts PostgresOptions, what string, create func(bindir, dataDir string) ProcConfig) (dsn string, stop func() error, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, k := range postgresFixedSettings {
		if _, ok := opts.Settings[k]; ok {
			return "", nil, fmt.Errorf("servers: postgres setting %s is managed by StartPostgres and cannot be set", k)
		}
	}
	bindir, err := postgresBinDir()
	if err != nil {
		return "", nil, err
	}
	cred, err := UserCredential("postgres")
	if err != nil {
		return "", nil, err
	}
	dir, err := NewServerDir(opts.Dir, "postgres", cred)
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	dataDir := filepath.Join(dir, "data")

	t0 := time.Now()
	cfg := create(bindir, dataDir)
	cfg.Dir, cfg.Credential = dir, cred
	if err = RunProc(ctx, cfg); err != nil {
		return "", nil, err
	}
	logf("servers: postgres: %s %s in %v", what, dataDir, time.Since(t0).Round(time.Millisecond))
	settings, err := configurePostgres(dataDir, cred, opts)
	if err != nil {
		return "", nil, err
	}

	for attempt := 1; ; attempt++ {
		t1 := time.Now()
		proc, port, err := startPostmaster(ctx, bindir, dir, dataDir, cred, settings)
		if err == nil {
			logf("servers: postgres: pid %d ready on 127.0.0.1:%d in %v (%v with %s)",
				proc.PID(), port, time.Since(t1).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), what)
			stop := AtExit("postgres", func() error {
				return errors.Join(proc.Stop(), os.RemoveAll(dir))
			})
			return postgresDSN(port, "postgres"), stop, nil
		}
		if proc == nil || attempt == postgresPortAttempts || !portTaken(proc) {
			return "", nil, err
		}
		logf("servers: postgres: port %d taken, retrying with another one", port)
	}
}

// configurePostgres writes the SSL files and pg_hba.conf of opts into
// dataDir and returns the settings to start the server with.
func configurePostgres(dataDir string, cred *syscall.Credential, opts PostgresOptions) (map[string]string, error) {
	settings := maps.Clone(opts.Settings)
	if settings == nil {
		settings = map[string]string{}
	}
	write := func(name string, b []byte) error {
		p := filepath.Join(dataDir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return fmt.Errorf("servers: postgres: %w", err)
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("servers: postgres: %w", err)
			}
		}
		return nil
	}
	if ssl := opts.SSL; ssl != nil {
		if err := errors.Join(write("server.crt", ssl.CertPEM), write("server.key", ssl.KeyPEM)); err != nil {
			return nil, err
		}
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = "server.crt"
		settings["ssl_key_file"] = "server.key"
		if len(ssl.CAPEM) > 0 {
			if err := write("root.crt", ssl.CAPEM); err != nil {
				return nil, err
			}
			settings["ssl_ca_file"] = "root.crt"
		}
	}
	if len(opts.HBA) > 0 {
		lines := append([]string{"host all postgres 127.0.0.1/32 trust"}, opts.HBA...)
		if err := write("pg_hba.conf", []byte(strings.Join(lines, "\n")+"\n")); err != nil {
			return nil, err
		}
	}
	return settings, nil
}

// startPostmaster starts the server on a free port and waits until it
// accepts connections. On failure the process, if it was started, has been
// stopped and is returned for inspection.
func startPostmaster(ctx context.Context, bindir, dir, dataDir string, cred *syscall.Credential, extra map[string]string) (*Proc, int, error) {
	port, err := postgresPort()
	if err != nil {
		return nil, 0, err
	}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": "",
		"fsync":                   "off",
		"synchronous_commit":      "on",
		"max_connections":         "300",
		"shared_buffers":          "128MB",
	}
	maps.Copy(settings, extra)
	args := []string{"-D", dataDir, "-p", strconv.Itoa(port)}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}
	proc, err := StartProc(ProcConfig{
		Name:       "postgres",
		Path:       filepath.Join(bindir, "postgres"),
		Args:       args,
		Dir:        dir,
		Credential: cred,
		// SIGINT is PostgreSQL's fast shutdown: disconnect clients, abort
		// their transactions, checkpoint, exit.
		StopSignal:  syscall.SIGINT,
		StopTimeout: postgresStopTimeout,
	})
	if err != nil {
		return nil, port, err
	}
	ctx, cancel := context.WithTimeout(ctx, postgresStartTimeout)
	defer cancel()
	dsn := postgresDSN(port, "postgres")
	err = proc.WaitReady(ctx, func(ctx context.Context) error {
		return probePostgres(ctx, dsn, dataDir)
	})
	if err != nil {
		_ = proc.Stop()
		return proc, port, err
	}
	return proc, port, nil
}

// probePostgres connects to dsn and checks that the server there runs the
// cluster in dataDir, not a server of another process that took the port.
func probePostgres(ctx context.Context, dsn, dataDir string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var got string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&got); err != nil {
		return err
	}
	if filepath.Clean(got) != filepath.Clean(dataDir) {
		return fmt.Errorf("port is served by another server (data directory %s)", got)
	}
	return nil
}

// portTaken reports whether the exited postgres process failed because its
// port was in use.
func portTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	tail := proc.Tail(20)
	return strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use")
}

func postgresDSN(port int, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     "127.0.0.1:" + strconv.Itoa(port),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// postgresBinDir finds the directory holding initdb and postgres.
func postgresBinDir() (string, error) {
	if d := os.Getenv(PostgresBinDirEnv); d != "" {
		if !hasPostgresBinaries(d) {
			return "", fmt.Errorf("servers: $%s=%s does not hold the PostgreSQL server binaries initdb and postgres; install them with `%s` or fix $%[1]s", PostgresBinDirEnv, d, postgresInstallHint)
		}
		return d, nil
	}
	candidates := []string{"/usr/lib/postgresql/15/bin"}
	others, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return v
	}
	slices.SortFunc(others, func(a, b string) int { return version(b) - version(a) })
	candidates = append(candidates, others...)
	if p, err := exec.LookPath("initdb"); err == nil {
		candidates = append(candidates, filepath.Dir(p))
	}
	for _, d := range candidates {
		if hasPostgresBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("servers: PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or $PATH; install them with `%s` (or set $%s)", postgresInstallHint, PostgresBinDirEnv)
}

func hasPostgresBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}
