package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outbox/internal/servers"
)

// redisInstallHint tells how to install the server.
const redisInstallHint = "apt-get update && apt-get install -y redis-server"

const (
	// redisStartTimeout bounds one start of redis-server (a few
	// milliseconds on an idle machine, plus loading its append-only file).
	redisStartTimeout = 30 * time.Second
	// redisPortAttempts is how many ports are tried when a picked one
	// turns out to be taken.
	redisPortAttempts = 5
)

// RedisOptions configures StartRedis.
type RedisOptions struct {
	// Dir is the base directory under which the server's own directory
	// (configuration, append-only file, log) is created; default
	// os.TempDir().
	Dir string
	// Password, if set, is the password of the default user (requirepass).
	Password string
	// Config holds extra redis.conf lines ("maxmemory 1mb", "user relay on
	// >secret ~* +@all"), appended after the defaults; port, bind, dir and
	// the TLS settings are managed by StartRedis.
	Config []string
	// TLSCertFile and TLSKeyFile, if set, open a TLS port too (TLSAddr),
	// with that server certificate and key (PEM); clients need not present
	// a certificate.
	TLSCertFile, TLSKeyFile string
	// Logf, if not nil, receives progress messages.
	Logf func(format string, args ...any)
}

// RedisServer is a redis-server started by StartRedis or Redis. Its methods
// are safe for concurrent use.
type RedisServer struct {
	dir, conf       string
	port, tlsPort   int
	password        string
	logf            func(format string, args ...any)
	redisServerPath string

	mu   sync.Mutex
	proc *Proc
}

// Addr returns the server's plain address, 127.0.0.1:PORT.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// TLSAddr returns the server's TLS address, or "" without TLS.
func (s *RedisServer) TLSAddr() string {
	if s.tlsPort == 0 {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(s.tlsPort)
}

// URL returns redis://[:password@]127.0.0.1:PORT (the default user).
func (s *RedisServer) URL() string {
	if s.password != "" {
		return "redis://:" + s.password + "@" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Client returns a go-redis client of the default user on the plain port;
// the caller closes it.
func (s *RedisServer) Client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: s.Addr(), Password: s.password, MaxRetries: -1})
}

// Pause stops the server (SIGTERM: it writes its append-only file and
// exits); its directory stays, for Resume.
func (s *RedisServer) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("testenv: redis: server is stopped")
	}
	err := s.proc.Stop()
	s.proc = nil
	return err
}

// Resume starts a paused server again on the same ports with the same data
// (its append-only file). It returns once the server answers. ctx bounds
// the start-up.
func (s *RedisServer) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("testenv: redis: server is running")
	}
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		proc, err := s.start(ctx)
		if err == nil {
			s.proc = proc
			s.logf("testenv: redis: restarted (pid %d) in %v", proc.PID(), time.Since(t0).Round(time.Millisecond))
			return nil
		}
		// The port was ours a moment ago: retry while it is still held.
		if proc == nil || attempt == redisPortAttempts || !redisPortTaken(proc) || ctx.Err() != nil {
			return err
		}
	}
}

// Restart is Pause then Resume.
func (s *RedisServer) Restart(ctx context.Context) error {
	if err := s.Pause(); err != nil {
		return err
	}
	return s.Resume(ctx)
}

func (s *RedisServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.proc != nil {
		errs = append(errs, s.proc.Stop())
		s.proc = nil
	}
	errs = append(errs, os.RemoveAll(s.dir))
	return errors.Join(errs...)
}

// StartRedis starts a throwaway redis-server from the Debian package
// redis-server, for use outside of tests (such as `outbox bench`); within
// tests use [Redis].
//
// The server listens on 127.0.0.1 only, on a free port, runs from a new
// directory under opts.Dir, and persists every write before acknowledging
// it (appendonly yes, appendfsync always), so that a restart keeps what it
// acknowledged, as a durable deployment does. It is killed if the current
// process dies. stop stops it (SIGTERM) and removes its directory; it is
// idempotent and Main calls it if the caller has not. ctx bounds start-up.
func StartRedis(ctx context.Context, opts RedisOptions) (server *RedisServer, stop func() error, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, line := range opts.Config {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "port" || f[0] == "bind" || f[0] == "dir" || strings.HasPrefix(f[0], "tls-")) {
			return nil, nil, fmt.Errorf("testenv: redis setting %q is managed by StartRedis and cannot be set", line)
		}
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil, fmt.Errorf("testenv: redis-server not found in $PATH: install it with `%s`", redisInstallHint)
	}
	dir, err := NewServerDir(opts.Dir, "redis", nil)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	for attempt := 1; ; attempt++ {
		s := &RedisServer{dir: dir, conf: filepath.Join(dir, "redis.conf"), password: opts.Password, logf: logf, redisServerPath: path}
		if s.port, err = FreePort(); err != nil {
			return nil, nil, err
		}
		if opts.TLSCertFile != "" {
			if s.tlsPort, err = FreePort(); err != nil {
				return nil, nil, err
			}
		}
		if err := os.WriteFile(s.conf, []byte(redisConfig(s, opts)), 0o600); err != nil {
			return nil, nil, fmt.Errorf("testenv: redis: %w", err)
		}
		t0 := time.Now()
		proc, err := s.start(ctx)
		if err == nil {
			s.proc = proc
			logf("testenv: redis: pid %d ready on %s in %v", proc.PID(), s.Addr(), time.Since(t0).Round(time.Millisecond))
			return s, servers.AtExit("redis", s.stop), nil
		}
		if proc == nil || attempt == redisPortAttempts || !redisPortTaken(proc) {
			return nil, nil, err
		}
		logf("testenv: redis: port %d taken, retrying with another one", s.port)
	}
}

// redisConfig is the redis.conf of s.
func redisConfig(s *RedisServer, opts RedisOptions) string {
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(s.port),
		"dir " + s.dir,
		"daemonize no",
		"save \"\"",
		"appendonly yes",
		"appendfsync always",
		"logfile \"\"", // stdout: the Proc's log
	}
	if s.password != "" {
		lines = append(lines, "requirepass "+s.password)
	}
	if opts.TLSCertFile != "" {
		lines = append(lines,
			"tls-port "+strconv.Itoa(s.tlsPort),
			"tls-cert-file "+opts.TLSCertFile,
			"tls-key-file "+opts.TLSKeyFile,
			"tls-auth-clients no",
		)
	}
	lines = append(lines, opts.Config...)
	return strings.Join(lines, "\n") + "\n"
}

// start starts the process on s's ports and waits until it answers.
func (s *RedisServer) start(ctx context.Context) (*Proc, error) {
	proc, err := StartProc(ProcConfig{Name: "redis", Path: s.redisServerPath, Args: []string{s.conf}, Dir: s.dir, StopTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, redisStartTimeout)
	defer cancel()
	err = proc.WaitReady(ctx, func(ctx context.Context) error { return s.probe(ctx, proc.PID()) })
	if err != nil {
		_ = proc.Stop()
		return proc, fmt.Errorf("testenv: redis: %w", err)
	}
	return proc, nil
}

// probe checks that the server on s's port is this process (INFO's
// process_id) and has loaded its data.
func (s *RedisServer) probe(ctx context.Context, pid int) error {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Password: s.password, MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
	defer c.Close()
	info, err := c.Info(ctx, "server", "persistence").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "process_id:"+strconv.Itoa(pid)+"\r\n") {
		return fmt.Errorf("another server answers on %s", s.Addr())
	}
	if strings.Contains(info, "loading:1") {
		return errors.New("loading its data")
	}
	return nil
}

// redisPortTaken reports whether the exited server failed because its port
// was in use.
func redisPortTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	tail := proc.Tail(40)
	return strings.Contains(tail, "Address already in use")
}

// Redis starts a redis-server for the test (see [StartRedis]), stopped and
// removed by t.Cleanup. Tests get a server each, so that they may restart,
// stop, fill or lock it down. A missing redis-server fails the test with the
// command that installs it.
func Redis(t testing.TB, opts RedisOptions) *RedisServer {
	t.Helper()
	requireMain(t)
	if opts.Logf == nil && testing.Verbose() {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisStartTimeout)
	defer cancel()
	s, stop, err := StartRedis(ctx, opts)
	if err != nil {
		t.Fatalf("testenv: redis: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("testenv: redis: stop: %v", err)
		}
	})
	return s
}
