package servers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of ProcConfig.
const (
	DefaultStopTimeout = 10 * time.Second
	// tailLines is how many log lines errors of Proc carry.
	tailLines = 40
	// tailBytes bounds how much of a log file Tail reads.
	tailBytes = 64 << 10
)

// ProcConfig describes an external server process for StartProc, or a
// one-shot command for RunProc.
type ProcConfig struct {
	// Name is a short label ("postgres", "rabbitmq") used in errors and in the
	// default log file name. Required.
	Name string
	// Path is the executable, Args its arguments (without argv[0]).
	Path string
	Args []string
	// Dir is the working directory of the process and the default location of
	// its log file. Required; it must exist (see NewServerDir).
	Dir string
	// Env is the environment of the process; nil means os.Environ().
	Env []string
	// LogFile receives the process's stdout and stderr, appended. Default:
	// filepath.Join(Dir, Name+".log").
	LogFile string
	// Credential, if not nil, runs the process as another user (see
	// UserCredential). Dir and the files the process writes must be
	// accessible to that user.
	Credential *syscall.Credential
	// StopSignal is the signal Stop sends first; default SIGTERM.
	StopSignal syscall.Signal
	// StopTimeout is how long Stop waits for the process to exit after
	// StopSignal before sending SIGKILL; default DefaultStopTimeout.
	StopTimeout time.Duration
}

func (c *ProcConfig) setDefaults() error {
	if c.Name == "" || c.Path == "" || c.Dir == "" {
		return fmt.Errorf("servers: ProcConfig needs Name, Path and Dir (got %q, %q, %q)", c.Name, c.Path, c.Dir)
	}
	if c.LogFile == "" {
		c.LogFile = filepath.Join(c.Dir, c.Name+".log")
	}
	if c.StopSignal == 0 {
		c.StopSignal = syscall.SIGTERM
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	return nil
}

// command builds the exec.Cmd for c, with its output going to the log file.
// It returns the open log file (to be closed by the caller once the process
// has started) and the log's size before this process wrote to it.
func (c *ProcConfig) command(ctx context.Context) (*exec.Cmd, *os.File, int64, error) {
	if err := c.setDefaults(); err != nil {
		return nil, nil, 0, err
	}
	log, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("servers: %s: open log: %w", c.Name, err)
	}
	fi, err := log.Stat()
	if err != nil {
		log.Close()
		return nil, nil, 0, fmt.Errorf("servers: %s: open log: %w", c.Name, err)
	}
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Dir = c.Dir
	cmd.Env = c.Env
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.Credential,
		// The kernel kills the child when the thread that started it dies,
		// i.e. in practice when the current process exits or crashes. (Go
		// never ends threads, except those of goroutines that exit while
		// locked with runtime.LockOSThread: do not start processes from
		// such goroutines.)
		Pdeathsig: syscall.SIGKILL,
	}
	return cmd, log, fi.Size(), nil
}

// Proc is a running external server process started by StartProc. Its
// stdout and stderr go to a log file; errors it returns carry the log's tail.
// All methods are safe for concurrent use.
type Proc struct {
	cfg      ProcConfig
	cmd      *exec.Cmd
	logStart int64 // offset in the log file where this process's output begins

	done    chan struct{} // closed when the process has exited
	waitErr error         // cmd.Wait's result, valid after done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartProc starts the process described by cfg and returns without waiting
// for it to be ready (see WaitReady). The process is SIGKILLed by the kernel
// if the current process dies; otherwise it runs until Stop.
func StartProc(cfg ProcConfig) (*Proc, error) {
	cmd, log, logStart, err := cfg.command(context.Background())
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child holds its own descriptor
	p := &Proc{cfg: cfg, cmd: cmd, logStart: logStart, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("servers: start %s (%s): %w", cfg.Name, cfg.Path, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// RunProc runs a one-shot command (such as initdb) to completion, with the
// same process setup as StartProc. The command is killed when ctx is done.
// On failure the error carries the tail of its output.
func RunProc(ctx context.Context, cfg ProcConfig) error {
	cmd, log, logStart, err := cfg.command(ctx)
	if err != nil {
		return err
	}
	err = cmd.Run()
	log.Close()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return fmt.Errorf("servers: %s failed: %w%s", cfg.Name, err, formatTail(cfg.LogFile, tailOf(cfg.LogFile, logStart, tailLines)))
	}
	return nil
}

// PID returns the process ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Name returns ProcConfig.Name.
func (p *Proc) Name() string { return p.cfg.Name }

// LogFile returns the path of the file receiving the process's output.
func (p *Proc) LogFile() string { return p.cfg.LogFile }

// Exited returns a channel closed when the process has exited, for whatever
// reason.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// ExitErr returns the process's exit error (nil for a zero exit status) once
// Exited is closed, and nil before.
func (p *Proc) ExitErr() error {
	select {
	case <-p.done:
		return p.waitErr
	default:
		return nil
	}
}

// Tail returns up to the last n lines this process wrote to its log file.
func (p *Proc) Tail(n int) string { return tailOf(p.cfg.LogFile, p.logStart, n) }

// WithLog returns err annotated with the process's name and PID and the tail
// of its log, for error messages about the process.
func (p *Proc) WithLog(err error) error {
	return fmt.Errorf("servers: %s (pid %d): %w%s", p.cfg.Name, p.PID(), err, formatTail(p.cfg.LogFile, p.Tail(tailLines)))
}

// WaitReady polls probe, with a short backoff, until it returns nil (ready),
// the process exits, or ctx is done. Give ctx a deadline. The probe should
// check readiness at the client level (connect and run a trivial request)
// and should verify that the server it reached is this process, as a port
// picked by FreePort may have been taken by another server meanwhile. The
// probe's context is cancelled when the process exits. Errors carry the last
// probe error and the log tail.
func (p *Proc) WaitReady(ctx context.Context, probe func(context.Context) error) error {
	// A probe blocked on a port that another process took (and does not
	// answer on) is cut short when this process exits.
	probeCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-probeCtx.Done():
		}
	}()
	delay := 5 * time.Millisecond
	for {
		err := probe(probeCtx)
		if err == nil {
			return nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-p.done:
			timer.Stop()
			return p.WithLog(fmt.Errorf("exited before becoming ready (%v); last probe error: %w", p.waitErr, err))
		case <-ctx.Done():
			timer.Stop()
			return p.WithLog(fmt.Errorf("not ready: %w; last probe error: %w", context.Cause(ctx), err))
		case <-timer.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// Stop stops the process: it sends StopSignal, waits up to StopTimeout for the
// process to exit and then sends SIGKILL. It returns an error if the process
// had to be killed or had already exited before Stop was called (a crash).
// Stop is idempotent; later calls return the first call's result.
func (p *Proc) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.stop() })
	return p.stopErr
}

func (p *Proc) stop() error {
	select {
	case <-p.done:
		return p.WithLog(fmt.Errorf("exited before Stop: %v", p.waitErr))
	default:
	}
	if err := p.cmd.Process.Signal(p.cfg.StopSignal); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return p.WithLog(fmt.Errorf("send %v: %w", p.cfg.StopSignal, err))
	}
	timer := time.NewTimer(p.cfg.StopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return p.WithLog(fmt.Errorf("send SIGKILL: %w", err))
	}
	timer.Reset(DefaultStopTimeout)
	select {
	case <-p.done:
		return p.WithLog(fmt.Errorf("did not exit within %v of %v; killed", p.cfg.StopTimeout, p.cfg.StopSignal))
	case <-timer.C:
		return p.WithLog(fmt.Errorf("did not exit within %v of SIGKILL", DefaultStopTimeout))
	}
}

// tailOf returns up to the last n lines of the file at path, reading no
// further back than offset start and at most tailBytes.
func tailOf(path string, start int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	from := max(start, fi.Size()-tailBytes)
	buf, err := io.ReadAll(io.NewSectionReader(f, from, fi.Size()-from))
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	buf = bytes.TrimRight(buf, "\n")
	lines := strings.Split(string(buf), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func formatTail(path, tail string) string {
	if tail == "" {
		return fmt.Sprintf("\n(log %s is empty)", path)
	}
	return fmt.Sprintf("\n--- last lines of %s ---\n%s\n---", path, tail)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago: it
// listens on port 0 and closes the listener. Another process may take the
// port before the server binds it; callers retry with a new port when the
// server fails to bind (see WaitReady).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("servers: pick a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("servers: pick a free port: %w", err)
	}
	return port, nil
}

// UserCredential returns the credential for running a process as the system
// user called name when the current process runs as root (servers such as
// PostgreSQL refuse to run as root), and nil, meaning the current user,
// otherwise.
func UserCredential(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("servers: running as root, and the servers must run as system user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("servers: user %q: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("servers: user %q: gid %q: %w", name, u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// DirPrefix starts the names of the directories made by NewServerDir:
// DirPrefix + name + "-" + a random string. It dates from when the
// helpers lived in internal/testenv and is kept so that directories left
// behind by older processes are still recognised.
const DirPrefix = "outbox-testenv-"

// ownerFile, in a directory made by NewServerDir, holds the PID of the process
// that made it.
const ownerFile = ".testenv-owner"

// NewServerDir creates a fresh directory for one server called name under
// base (default os.TempDir()), with mode 0755 and owned by cred's user when
// cred is not nil. Unlike t.TempDir, the result is usable by a server running
// as another user; NewServerDir checks that every parent directory lets that
// user through. The caller removes the directory when the server has stopped.
//
// Directories left behind by processes that died without cleaning up
// (a crash or a -timeout panic) are removed first.
func NewServerDir(base, name string, cred *syscall.Credential) (string, error) {
	if base == "" {
		base = os.TempDir()
	}
	base, err := filepath.Abs(base)
	if err != nil {
		return "", fmt.Errorf("servers: %w", err)
	}
	removeStaleDirs(base)
	if cred != nil {
		if err := checkSearchable(base); err != nil {
			return "", err
		}
	}
	dir, err := os.MkdirTemp(base, DirPrefix+name+"-*")
	if err != nil {
		return "", fmt.Errorf("servers: %w", err)
	}
	err = os.Chmod(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("servers: prepare %s: %w", dir, err)
	}
	return dir, nil
}

// checkSearchable returns an error unless dir and all its parents can be
// traversed by any user.
func checkSearchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("servers: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("servers: directory %s (mode %v) is not searchable by other users, so a server running as another user cannot use %s; use a base directory whose parents are all 0755 (like os.TempDir())", d, fi.Mode().Perm(), dir)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// removeStaleDirs removes, best effort, the directories under base made by
// NewServerDir for processes that no longer exist.
func removeStaleDirs(base string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), DirPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}
