package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BrokerCommand is the hidden `outbox` subcommand the bench runs as its
// broker process (`outbox bench broker-process`): the embedded NATS server
// with JetStream file storage, printing its client URL on a line of stdout
// and serving until SIGTERM.
var BrokerCommand = []string{"bench", "broker-process"}

// childStopTimeout bounds a child's graceful exit before it is killed.
const childStopTimeout = 30 * time.Second

// child is a process the bench started from its own binary: an `outbox
// relay` or the broker. Its CPU time is read from /proc.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's, once done is closed

	mu     sync.Mutex
	stderr []byte // the last childStderrMax bytes
}

const childStderrMax = 4 << 10

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stderr = append(c.stderr, p...)
	if n := len(c.stderr); n > childStderrMax {
		c.stderr = c.stderr[n-childStderrMax:]
	}
	return len(p), nil
}

// lastWords is the end of the child's stderr, for an error message.
func (c *child) lastWords() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := strings.TrimSpace(string(c.stderr)); s != "" {
		return "; its stderr ends with: " + s
	}
	return ""
}

// executable is the binary the bench re-executes: o.Executable or its own.
func executable(o Options) (string, error) {
	if o.Executable != "" {
		return o.Executable, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("bench: find the bench's own binary to run the relay and broker processes: %w", err)
	}
	return exe, nil
}

// startChild starts the bench's binary with args. Its environment is the
// bench's without OUTBOX_* variables (which would configure the relay
// behind the bench's back), plus env (such as OUTBOX_STORE: URLs with
// credentials stay out of the process list) and o.ChildEnv. The first line
// the process prints on stdout is sent on the returned channel (closed
// without one if it prints none); the rest is discarded.
func startChild(ctx context.Context, o Options, name string, args, env []string) (*child, <-chan string, error) {
	exe, err := executable(o)
	if err != nil {
		return nil, nil, err
	}
	return startProcess(ctx, o, name, exe, args, env)
}

// startProcess is startChild with the binary exe.
func startProcess(ctx context.Context, o Options, name, exe string, args, env []string) (*child, <-chan string, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	c := &child{name: name, done: make(chan struct{})}
	cmd := exec.Command(exe, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, env...), o.ChildEnv...)
	cmd.Stderr = c
	// Die with the bench.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bench: start the %s process (%s): %w", name, exe, err)
	}
	c.cmd = cmd
	first := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		r := bufio.NewReader(out)
		if line, err := r.ReadString('\n'); err == nil {
			first <- strings.TrimSpace(line)
		}
		close(first)
		_, _ = io.Copy(io.Discard, r)
	}()
	go func() {
		<-copied // Wait closes the pipe: read it all first
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, first, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// cpu returns the process's CPU time so far (user + system), from /proc.
func (c *child) cpu() (time.Duration, bool) {
	t, ok := procStat(c.pid())
	return t.cpu, ok
}

// exited reports whether the process has exited, with Wait's error.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to childStopTimeout for the exit, then
// kills. An exit status other than 0 is an error.
func (c *child) stop() error {
	if done, err := c.exited(); done {
		return c.exitErr(err)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(childStopTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("bench: the %s process did not exit within %v of SIGTERM: killed%s", c.name, childStopTimeout, c.lastWords())
	}
	return c.exitErr(c.err)
}

func (c *child) exitErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bench: the %s process: %w%s", c.name, err, c.lastWords())
}

// scrapeMetrics reads url (a Prometheus /metrics) and returns the sum of
// every metric's samples (over its label sets), by name.
func scrapeMetrics(ctx context.Context, client *http.Client, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics sums the samples of each metric of a Prometheus text
// exposition, by name (labels dropped).
func parseMetrics(r io.Reader) (map[string]float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	out := map[string]float64{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			i := strings.LastIndexByte(rest, '}')
			if i < 0 {
				return nil, fmt.Errorf("malformed sample %q", line)
			}
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("malformed sample %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("malformed sample %q: %w", line, err)
		}
		out[name] += v
	}
	return out, sc.Err()
}
