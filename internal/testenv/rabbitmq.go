package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/servers"
)

// RabbitMQServerEnv names an environment variable that, when set, is the
// path of the rabbitmq-server script to run instead of the Debian package's
// /usr/lib/rabbitmq/bin/rabbitmq-server.
const RabbitMQServerEnv = "OUTBOX_RABBITMQ_SERVER"

// rabbitmqInstallHint tells how to install the server.
const rabbitmqInstallHint = "apt-get update && apt-get install -y rabbitmq-server"

const (
	rabbitmqDefaultServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	// rabbitmqStartTimeout bounds one boot of the node (6 to 16 s on an idle
	// machine; much more on a loaded one).
	rabbitmqStartTimeout = 2 * time.Minute
	// rabbitmqStopTimeout is how long a graceful shutdown (SIGTERM) may take
	// before the node is killed.
	rabbitmqStopTimeout = 30 * time.Second
	// rabbitmqPortAttempts is how many sets of ports are tried when a picked
	// one turns out to be taken.
	rabbitmqPortAttempts = 5
)

// RabbitMQOptions configures StartRabbitMQ.
type RabbitMQOptions struct {
	// Dir is the base directory under which the node's own directory
	// (configuration, Mnesia database, logs, Erlang cookie) is created;
	// default os.TempDir().
	Dir string
	// Config holds extra rabbitmq.conf lines ("key = value"), appended after
	// the defaults; listeners.tcp.default cannot be set.
	Config []string
	// Logf, if not nil, receives progress messages, such as start-up timings.
	Logf func(format string, args ...any)
}

// RabbitMQNode is a RabbitMQ node started by StartRabbitMQ or RabbitMQ. Its
// methods are safe for concurrent use.
type RabbitMQNode struct {
	dir      string
	nodename string
	script   string
	env      []string
	amqpPort int
	logf     func(format string, args ...any)

	mu     sync.Mutex
	epmd   *Proc
	server *Proc
}

// URL returns the node's AMQP URL, amqp://guest:guest@127.0.0.1:PORT/.
func (n *RabbitMQNode) URL() string { return rabbitmqURL(n.amqpPort) }

// Restart stops the node gracefully (SIGTERM; connections are closed) and
// starts it again on the same port with the same data directory, so durable
// queues and persistent messages survive. It returns once the node accepts
// AMQP connections again. ctx bounds the start-up.
func (n *RabbitMQNode) Restart(ctx context.Context) error {
	if err := n.Pause(); err != nil {
		return err
	}
	return n.Resume(ctx)
}

// Pause stops the node gracefully (SIGTERM; connections are closed); its
// epmd and data stay, for Resume.
func (n *RabbitMQNode) Pause() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.server == nil {
		return errors.New("testenv: rabbitmq: node is stopped")
	}
	err := n.server.Stop()
	n.server = nil
	return err
}

// Resume starts a paused node again on the same port with the same data
// directory. It returns once the node accepts AMQP connections again. ctx
// bounds the start-up.
func (n *RabbitMQNode) Resume(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.server != nil {
		return errors.New("testenv: rabbitmq: node is running")
	}
	t0 := time.Now()
	// The port was ours a moment ago; retry the bind for a while if it is
	// still held (sockets lingering in TIME_WAIT without SO_REUSEADDR).
	for attempt := 1; ; attempt++ {
		proc, err := n.startServer(ctx)
		if err == nil {
			n.server = proc
			n.logf("testenv: rabbitmq: restarted %s (pid %d) in %v", n.nodename, proc.PID(), time.Since(t0).Round(time.Millisecond))
			return nil
		}
		if proc == nil || attempt == rabbitmqPortAttempts || !rabbitmqPortTaken(proc) || ctx.Err() != nil {
			return err
		}
		n.logf("testenv: rabbitmq: port %d still taken after restart, retrying", n.amqpPort)
	}
}

// Ctl runs rabbitmqctl with args against the node (such as
// "set_vm_memory_high_watermark", "0.4") and returns its output. ctx bounds
// the command.
func (n *RabbitMQNode) Ctl(ctx context.Context, args ...string) (string, error) {
	ctl := filepath.Join(filepath.Dir(n.script), "rabbitmqctl")
	out, err := os.CreateTemp(n.dir, "rabbitmqctl-*.log")
	if err != nil {
		return "", fmt.Errorf("testenv: rabbitmqctl: %w", err)
	}
	out.Close()
	defer os.Remove(out.Name())
	err = RunProc(ctx, ProcConfig{
		Name:    "rabbitmqctl",
		Path:    ctl,
		Args:    append([]string{"--node", n.nodename}, args...),
		Dir:     n.dir,
		Env:     n.env,
		LogFile: out.Name(),
	})
	b, readErr := os.ReadFile(out.Name())
	return string(b), errors.Join(err, readErr)
}

// stop stops the node and its epmd and removes its directory.
func (n *RabbitMQNode) stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	if n.server != nil {
		errs = append(errs, n.server.Stop())
		n.server = nil
	}
	if n.epmd != nil {
		errs = append(errs, n.epmd.Stop())
		n.epmd = nil
	}
	errs = append(errs, os.RemoveAll(n.dir))
	return errors.Join(errs...)
}

// StartRabbitMQ starts a standalone, throwaway RabbitMQ node from the Debian
// package rabbitmq-server, for use outside of tests (such as the `outbox
// bench` command). Within tests use [RabbitMQ].
//
// The node runs from a new directory under opts.Dir (configuration, Mnesia
// database, logs and the Erlang cookie, as $HOME), with its own epmd; AMQP,
// Erlang distribution and epmd listen on 127.0.0.1 only, on free ports. The
// guest user may connect from anywhere (loopback_users = none), no plugins
// are enabled (no management UI), and the free-disk alarm is effectively off
// (1MB). Boot takes 6 to 16 seconds. The processes are killed if the current
// process dies.
//
// StartRabbitMQ returns the node, whose URL method gives the AMQP URL, and a
// stop function that shuts the node down (SIGTERM, then SIGKILL after 30s),
// stops its epmd and removes its directory. stop is idempotent, and Main
// calls it if the caller has not. ctx bounds the start-up.
func StartRabbitMQ(ctx context.Context, opts RabbitMQOptions) (node *RabbitMQNode, stop func() error, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, line := range opts.Config {
		if strings.HasPrefix(strings.TrimSpace(line), "listeners.tcp") {
			return nil, nil, fmt.Errorf("testenv: rabbitmq setting %q is managed by StartRabbitMQ and cannot be set", line)
		}
	}
	script, err := rabbitmqServerScript()
	if err != nil {
		return nil, nil, err
	}
	for attempt := 1; ; attempt++ {
		n, portTaken, err := startRabbitMQNode(ctx, script, opts, logf)
		if err == nil {
			stop := servers.AtExit("rabbitmq", n.stop)
			return n, stop, nil
		}
		if !portTaken || attempt == rabbitmqPortAttempts || ctx.Err() != nil {
			return nil, nil, err
		}
		logf("testenv: rabbitmq: a port was taken, retrying with other ports")
	}
}

// startRabbitMQNode makes a directory, picks ports, and starts epmd and the
// node. On failure everything is stopped and the directory removed;
// portTaken reports whether the failure was a picked port being taken.
func startRabbitMQNode(ctx context.Context, script string, opts RabbitMQOptions, logf func(string, ...any)) (n *RabbitMQNode, portTaken bool, err error) {
	dir, err := NewServerDir(opts.Dir, "rabbitmq", nil)
	if err != nil {
		return nil, false, err
	}
	n = &RabbitMQNode{dir: dir, script: script, logf: logf}
	var epmdFailed, serverFailed *Proc
	defer func() {
		if err != nil {
			// Before stop, which removes the logs.
			portTaken = epmdFailed != nil && epmdPortTaken(epmdFailed) || serverFailed != nil && rabbitmqPortTaken(serverFailed)
			_ = n.stop()
		}
	}()

	var ports [3]int
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return n, false, err
		}
	}
	n.amqpPort = ports[0]
	distPort, epmdPort := ports[1], ports[2]
	suffix := filepath.Base(dir)[len(servers.DirPrefix+"rabbitmq-"):]
	n.nodename = "rabbit-" + strings.ToLower(suffix) + "@localhost"

	conf := []string{
		"listeners.tcp.default = 127.0.0.1:" + strconv.Itoa(n.amqpPort),
		"loopback_users = none",
		// The probe checks it to tell this node from another on the port.
		"cluster_name = " + n.nodename,
		"disk_free_limit.absolute = 1MB",
		"log.console = true",
		"log.console.level = warning",
		"log.file.level = info",
	}
	conf = append(conf, opts.Config...)
	files := map[string]string{
		"rabbitmq.conf":     strings.Join(conf, "\n") + "\n",
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return n, false, fmt.Errorf("testenv: rabbitmq: %w", err)
		}
	}
	for _, sub := range []string{"home", "mnesia", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return n, false, fmt.Errorf("testenv: rabbitmq: %w", err)
		}
	}
	epmdAddr := []string{"ERL_EPMD_ADDRESS=127.0.0.1", "ERL_EPMD_PORT=" + strconv.Itoa(epmdPort)}
	n.env = append(rabbitmqBaseEnv(), epmdAddr...)
	n.env = append(n.env,
		"HOME="+filepath.Join(dir, "home"),
		"RABBITMQ_NODENAME="+n.nodename,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		// Make the script exec the Erlang VM instead of running it as a
		// child behind a signal-forwarding shell, so that the process we
		// start is the VM itself: SIGTERM stops it gracefully, and it dies
		// with the test process (Pdeathsig would only kill the shell).
		"RUNNING_UNDER_SYSTEMD=true",
		// Erlang distribution on loopback only.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	)

	t0 := time.Now()
	epmd, err := StartProc(ProcConfig{
		Name: "epmd",
		Path: rabbitmqEpmdPath(),
		Args: []string{"-address", "127.0.0.1", "-port", strconv.Itoa(epmdPort)},
		Dir:  dir,
		Env:  n.env,
	})
	if err != nil {
		return n, false, err
	}
	n.epmd = epmd
	epmdCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = epmd.WaitReady(epmdCtx, func(ctx context.Context) error { return probeTCP(ctx, epmdPort) })
	cancel()
	if err != nil {
		epmdFailed = epmd
		return n, false, err
	}

	server, err := n.startServer(ctx)
	if err != nil {
		serverFailed = server
		return n, false, err
	}
	n.server = server
	logf("testenv: rabbitmq: node %s (pid %d) ready on 127.0.0.1:%d in %v", n.nodename, server.PID(), n.amqpPort, time.Since(t0).Round(time.Millisecond))
	return n, false, nil
}

// startServer runs the rabbitmq-server script with n's environment and
// waits until the node accepts AMQP connections. On failure the process, if
// started, has been stopped and is returned for inspection.
func (n *RabbitMQNode) startServer(ctx context.Context) (*Proc, error) {
	proc, err := StartProc(ProcConfig{
		Name:        "rabbitmq",
		Path:        n.script,
		Dir:         n.dir,
		Env:         n.env,
		StopSignal:  syscall.SIGTERM,
		StopTimeout: rabbitmqStopTimeout,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, rabbitmqStartTimeout)
	defer cancel()
	err = proc.WaitReady(ctx, func(ctx context.Context) error {
		return probeRabbitMQ(ctx, n.URL(), n.nodename)
	})
	if err != nil {
		_ = proc.Stop()
		return proc, err
	}
	return proc, nil
}

// probeRabbitMQ opens an AMQP connection and a channel, and checks that the
// node answering is nodename (StartRabbitMQ sets the cluster name to it).
func probeRabbitMQ(ctx context.Context, u, nodename string) error {
	deadline := time.Now().Add(5 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn, err := amqp.DialConfig(u, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, time.Until(deadline))
			if err != nil {
				return nil, err
			}
			return c, c.SetDeadline(deadline)
		},
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	if name, _ := conn.Properties["cluster_name"].(string); name != nodename {
		return fmt.Errorf("port is served by another node (cluster_name %q, want %q)", name, nodename)
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return ch.Close()
}

// probeTCP succeeds when something accepts TCP connections on port.
func probeTCP(ctx context.Context, port int) error {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	return c.Close()
}

// rabbitmqPortTaken reports whether the exited node failed because its AMQP
// or distribution port was in use.
func rabbitmqPortTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	tail := proc.Tail(200)
	return strings.Contains(tail, "eaddrinuse") || strings.Contains(tail, "could_not_start_listener")
}

// epmdPortTaken reports whether epmd exited because its port was in use.
func epmdPortTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	tail := proc.Tail(20)
	return strings.Contains(tail, "address already in use") || strings.Contains(tail, "Address already in use")
}

// rabbitmqBaseEnv is the environment of the node: the current one without
// the variables that configure RabbitMQ or Erlang, which the node gets from
// StartRabbitMQ alone.
func rabbitmqBaseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "RABBITMQ_") || strings.HasPrefix(k, "ERL_") || k == "HOME" || k == "NOTIFY_SOCKET" || k == "RUNNING_UNDER_SYSTEMD" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func rabbitmqURL(port int) string {
	return (&url.URL{Scheme: "amqp", User: url.UserPassword("guest", "guest"), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/"}).String()
}

// rabbitmqServerScript finds the rabbitmq-server script.
func rabbitmqServerScript() (string, error) {
	path, fromEnv := os.Getenv(RabbitMQServerEnv), true
	if path == "" {
		path, fromEnv = rabbitmqDefaultServer, false
	}
	fi, err := os.Stat(path)
	if err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0 {
		return path, nil
	}
	if fromEnv {
		return "", fmt.Errorf("testenv: $%s=%s is not an executable rabbitmq-server script", RabbitMQServerEnv, path)
	}
	return "", fmt.Errorf("testenv: RabbitMQ server not found at %s; install it with `%s` (or set $%s)", path, rabbitmqInstallHint, RabbitMQServerEnv)
}

// rabbitmqEpmdPath returns the epmd of the Erlang installation.
func rabbitmqEpmdPath() string {
	if _, err := os.Stat("/usr/bin/epmd"); err == nil {
		return "/usr/bin/epmd"
	}
	return "epmd"
}

// sharedRabbitMQ is the test process's RabbitMQ node.
var sharedRabbitMQ lazy[*RabbitMQNode]

func sharedRabbitMQNode(t testing.TB) *RabbitMQNode {
	t.Helper()
	requireMain(t)
	n, err := startSharedRabbitMQ()
	if err != nil {
		t.Fatalf("testenv: RabbitMQ: %v", err)
	}
	return n
}

func startSharedRabbitMQ() (*RabbitMQNode, error) {
	return sharedRabbitMQ.get(func() (*RabbitMQNode, error) {
		ctx, cancel := context.WithTimeout(context.Background(), rabbitmqStartTimeout)
		defer cancel()
		n, _, err := StartRabbitMQ(ctx, RabbitMQOptions{})
		return n, err
	})
}

// SharedRabbitMQ is [RabbitMQ] for code without a testing.TB, such as
// Example functions: it returns the URL of the test process's node,
// starting it on first use. The test binary must run through [Main].
func SharedRabbitMQ() (string, error) {
	if !mainActive.Load() {
		return "", errors.New("testenv: the shared RabbitMQ node needs the package's tests to run through testenv.Main")
	}
	n, err := startSharedRabbitMQ()
	if err != nil {
		return "", err
	}
	return n.URL(), nil
}

// RabbitMQ returns the AMQP URL (amqp://guest:guest@127.0.0.1:PORT/) of the
// test process's RabbitMQ node. The node is started on first use, once per
// test process (boot takes 6 to 16 s), and stopped by Main, which must run
// the package's tests. Tests share the node: isolate them by naming queues
// and exchanges with [Name]. If the node cannot be started (for instance
// because rabbitmq-server is not installed; the error says how to install
// it), RabbitMQ calls t.Fatalf.
func RabbitMQ(t testing.TB) string {
	t.Helper()
	return sharedRabbitMQNode(t).URL()
}

// RabbitMQCtl runs rabbitmqctl with args against the test process's node
// and returns its output; it calls t.Fatalf if the command fails. Tests that
// change the node's state (alarms, limits) must restore it and must not run
// in parallel with other tests using the node.
func RabbitMQCtl(t testing.TB, args ...string) string {
	t.Helper()
	n := sharedRabbitMQNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Ctl(ctx, args...)
	if err != nil {
		t.Fatalf("testenv: rabbitmqctl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// PauseRabbitMQ stops the test process's RabbitMQ node (see
// [RabbitMQNode.Pause]) and returns a function that starts it again, as
// [RestartRabbitMQ] does, and returns once it accepts connections. Each
// calls t.Fatalf if it fails. Tests that stop the node must not run in
// parallel with other tests using it.
func PauseRabbitMQ(t testing.TB) (resume func(t testing.TB)) {
	t.Helper()
	n := sharedRabbitMQNode(t)
	if err := n.Pause(); err != nil {
		t.Fatalf("testenv: stop RabbitMQ: %v", err)
	}
	return func(t testing.TB) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), rabbitmqStartTimeout)
		defer cancel()
		if err := n.Resume(ctx); err != nil {
			t.Fatalf("testenv: start RabbitMQ again: %v", err)
		}
	}
}

// RestartRabbitMQ restarts the test process's RabbitMQ node (see
// [RabbitMQNode.Restart]): open connections are closed, and the node comes
// back on the same URL with its durable queues and persistent messages. It
// returns once the node accepts connections again; it calls t.Fatalf if the
// node does not come back. Tests that restart the node must not run in
// parallel with other tests using it.
func RestartRabbitMQ(t testing.TB) {
	t.Helper()
	n := sharedRabbitMQNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), rabbitmqStartTimeout)
	defer cancel()
	if err := n.Restart(ctx); err != nil {
		t.Fatalf("testenv: restart RabbitMQ: %v", err)
	}
}

// RabbitMQTLS starts a RabbitMQ node of this test with a TLS listener whose
// certificate pki issued, and returns its amqps URL
// (amqps://guest:guest@127.0.0.1:PORT/). With requireClientCert, clients
// must present a certificate pki signed. The node (boot takes 6 to 16 s) is
// stopped by t.Cleanup.
func RabbitMQTLS(t testing.TB, pki *PKI, requireClientCert bool) string {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	server := pki.Server("rabbitmq")
	ctx, cancel := context.WithTimeout(context.Background(), rabbitmqStartTimeout)
	defer cancel()
	_, stop, err := StartRabbitMQ(ctx, RabbitMQOptions{Dir: t.TempDir(), Config: []string{
		"listeners.ssl.default = 127.0.0.1:" + strconv.Itoa(port),
		"ssl_options.cacertfile = " + pki.CAFile,
		"ssl_options.certfile = " + server.CertFile,
		"ssl_options.keyfile = " + server.KeyFile,
		"ssl_options.verify = verify_peer",
		"ssl_options.fail_if_no_peer_cert = " + strconv.FormatBool(requireClientCert),
	}})
	if err != nil {
		t.Fatalf("testenv: RabbitMQ with TLS: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("testenv: stop RabbitMQ: %v", err)
		}
	})
	return (&url.URL{Scheme: "amqps", User: url.UserPassword("guest", "guest"), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/"}).String()
}
