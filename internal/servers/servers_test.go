package servers_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/outbox/internal/servers"
)

// The tests of this package do not run in parallel: TestStopAll stops every
// registered server.

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

func queryString(t testing.TB, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	check(t, conn.QueryRow(context.Background(), sql, args...).Scan(&s), sql)
	return s
}

func TestStartPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, _, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: map[string]string{"port": "5432"}})
	errorContains(t, err, "port")

	// Not t.TempDir: as root, the server runs as user postgres, which needs
	// to get through the base directory.
	base, err := os.MkdirTemp("", "outbox-servers-test-")
	check(t, err, "mkdir")
	t.Cleanup(func() { os.RemoveAll(base) })
	check(t, os.Chmod(base, 0o755), "chmod")

	dsn, stop, err := servers.StartPostgres(ctx, servers.PostgresOptions{
		Dir:      base,
		Settings: map[string]string{"work_mem": "8MB"},
		Logf:     t.Logf,
	})
	check(t, err, "StartPostgres")

	conn, err := pgx.Connect(ctx, dsn)
	check(t, err, "connect")
	if got := queryString(t, conn, "SHOW work_mem"); got != "8MB" {
		t.Errorf("work_mem = %s, want 8MB from Settings", got)
	}
	if got := queryString(t, conn, "SHOW synchronous_commit"); got != "on" {
		t.Errorf("synchronous_commit = %s, want on", got)
	}
	check(t, conn.Close(ctx), "close")

	entries, err := os.ReadDir(base)
	check(t, err, "read Dir")
	if len(entries) != 1 {
		t.Errorf("Dir holds %d entries, want the server's directory", len(entries))
	}

	stopped := time.Now()
	check(t, stop(), "stop")
	t.Logf("stopped in %v", time.Since(stopped).Round(time.Millisecond))
	check(t, stop(), "second stop")

	entries, err = os.ReadDir(base)
	check(t, err, "read Dir")
	if len(entries) != 0 {
		t.Errorf("Dir holds %d entries after stop, want none", len(entries))
	}
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Errorf("server still accepts connections after stop")
	}
}

func TestStartPostgresMissingBinaries(t *testing.T) {
	t.Setenv(servers.PostgresBinDirEnv, t.TempDir())
	_, _, err := servers.StartPostgres(context.Background(), servers.PostgresOptions{})
	errorContains(t, err, "apt-get install -y postgresql-15")
}

func TestStartNATS(t *testing.T) {
	s, stop, err := servers.StartNATS("")
	check(t, err, "StartNATS")
	storeDir := s.JetStreamConfig().StoreDir
	if _, err := os.Stat(storeDir); err != nil {
		t.Errorf("store directory: %v", err)
	}

	nc, err := nats.Connect(s.ClientURL())
	check(t, err, "connect")
	check(t, nc.Publish("x", []byte("y")), "publish")
	check(t, nc.Flush(), "flush")
	nc.Close()

	stop()
	stop() // idempotent
	if s.Running() {
		t.Error("server still running after stop")
	}
	// JetStream stores under StoreDir/jetstream; the temporary directory
	// given to the server is its parent.
	if _, err := os.Stat(filepath.Dir(storeDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary store directory not removed: %v", err)
	}
}

func TestProcStopEscalatesToKill(t *testing.T) {
	dir := t.TempDir()
	p, err := servers.StartProc(servers.ProcConfig{
		Name:        "stubborn",
		Path:        "/bin/sh",
		Args:        []string{"-c", `trap 'echo got TERM' TERM; echo started; while :; do sleep 0.05; done`},
		Dir:         dir,
		StopTimeout: 300 * time.Millisecond,
	})
	check(t, err, "StartProc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check(t, p.WaitReady(ctx, func(context.Context) error {
		if !strings.Contains(p.Tail(10), "started") {
			return errors.New("not started")
		}
		return nil
	}), "WaitReady")
	if want := filepath.Join(dir, "stubborn.log"); p.LogFile() != want {
		t.Errorf("LogFile = %s, want %s", p.LogFile(), want)
	}

	err = p.Stop()
	errorContains(t, err, "killed", "got TERM")
	if again := p.Stop(); again != err {
		t.Errorf("second Stop = %v, want the first result", again)
	}
	var exit *exec.ExitError
	if !errors.As(p.ExitErr(), &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("ExitErr = %v, want killed by SIGKILL", p.ExitErr())
	}
}

func TestProcWaitReadyNoticesExit(t *testing.T) {
	p, err := servers.StartProc(servers.ProcConfig{
		Name: "crasher",
		Path: "/bin/sh",
		Args: []string{"-c", "echo fatal: cannot start >&2; exit 3"},
		Dir:  t.TempDir(),
	})
	check(t, err, "StartProc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = p.WaitReady(ctx, func(context.Context) error { return errors.New("connection refused") })
	errorContains(t, err, "exited before becoming ready", "exit status 3", "fatal: cannot start", "connection refused")
	errorContains(t, p.Stop(), "exited before Stop")
}

func TestRunProcReportsOutput(t *testing.T) {
	err := servers.RunProc(context.Background(), servers.ProcConfig{
		Name: "failing",
		Path: "/bin/sh",
		Args: []string{"-c", "echo something went wrong; exit 1"},
		Dir:  t.TempDir(),
	})
	errorContains(t, err, "failing failed", "something went wrong")
}

func TestStopAll(t *testing.T) {
	s, stop, err := servers.StartNATS("")
	check(t, err, "StartNATS")
	defer stop()
	storeDir := s.JetStreamConfig().StoreDir

	check(t, servers.StopAll(), "StopAll")
	if s.Running() {
		t.Error("server still running after StopAll")
	}
	if _, err := os.Stat(filepath.Dir(storeDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary store directory not removed: %v", err)
	}
	check(t, servers.StopAll(), "second StopAll")
}
