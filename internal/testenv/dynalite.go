package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/servers"
)

// dynaliteInstallHint tells how to install dynalite: it is pinned in the
// repository's package.json and package-lock.json.
const dynaliteInstallHint = "run `npm ci` in the repository root (dynalite)"

const (
	// dynaliteStartTimeout bounds node's start-up plus dynalite's.
	dynaliteStartTimeout = 30 * time.Second
	// dynalitePortAttempts is how many ports are tried when the picked one
	// turns out to be taken.
	dynalitePortAttempts = 5
	// DynaliteRegion is the region the endpoint accepts; dynalite accepts any
	// region and any credentials, but clients need one.
	DynaliteRegion = "us-east-1"
)

// DynaliteOptions configures StartDynalite.
type DynaliteOptions struct {
	// Dir is the base directory under which the server's directory (its
	// log) is created; default os.TempDir().
	Dir string
	// ModuleRoot is the directory holding node_modules/dynalite; default:
	// the nearest directory holding go.mod, from the working directory up.
	ModuleRoot string
	// Logf, if not nil, receives progress messages.
	Logf func(format string, args ...any)
}

// StartDynalite starts dynalite, an in-memory implementation of the
// DynamoDB API, from the repository's own node_modules (pinned in
// package.json; install with `npm ci`), for use outside of tests (such as
// `outbox bench`). Within tests use [Dynalite].
//
// The server listens on 127.0.0.1 on a free port with tables that become
// ACTIVE at once (--createTableMs 0 and friends), keeps everything in
// memory, and is killed if the current process dies. Any credentials and
// region are accepted (use [DynaliteRegion]). dynalite implements the
// single-item, batch, Query and Scan operations with global secondary
// indexes, but not TransactWriteItems, TransactGetItems or TTL.
//
// StartDynalite returns the endpoint URL (http://127.0.0.1:PORT) and a stop
// function that stops the server and removes its directory; stop is
// idempotent, and Main calls it if the caller has not. ctx bounds start-up.
func StartDynalite(ctx context.Context, opts DynaliteOptions) (endpoint string, stop func() error, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	cli, err := dynaliteCLI(opts.ModuleRoot)
	if err != nil {
		return "", nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return "", nil, fmt.Errorf("testenv: dynalite needs Node.js, not found in $PATH: install it with `apt-get install -y nodejs npm`, then %s", dynaliteInstallHint)
	}
	dir, err := NewServerDir(opts.Dir, "dynalite", nil)
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	for attempt := 1; ; attempt++ {
		t0 := time.Now()
		proc, port, err := startDynaliteProc(ctx, node, cli, dir)
		if err == nil {
			logf("testenv: dynalite: pid %d ready on 127.0.0.1:%d in %v", proc.PID(), port, time.Since(t0).Round(time.Millisecond))
			stop := servers.AtExit("dynalite", func() error {
				return errors.Join(proc.Stop(), os.RemoveAll(dir))
			})
			return dynaliteEndpoint(port), stop, nil
		}
		if proc == nil || attempt == dynalitePortAttempts || !dynalitePortTaken(proc) {
			return "", nil, err
		}
		logf("testenv: dynalite: port %d taken, retrying with another one", port)
	}
}

// dynaliteKeepServing is loaded before dynalite. A client that gives up on
// a request (its context ends: a timeout, a relay stopping) closes the
// connection mid-request; dynalite's request handler rethrows that error,
// which would end the process and fail every later test of the package.
// DynamoDB carries on, and so does dynalite with this.
const dynaliteKeepServing = `process.on('uncaughtException', function (err) {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('dynalite: a client aborted a request: ' + err.message)
    return
  }
  console.error((err && err.stack) || err)
  process.exit(1)
})
`

// startDynaliteProc starts dynalite on a free port and waits until it serves
// requests. On failure the process, if started, has been stopped and is
// returned for inspection.
func startDynaliteProc(ctx context.Context, node, cli, dir string) (*Proc, int, error) {
	port, err := FreePort()
	if err != nil {
		return nil, 0, err
	}
	preload := filepath.Join(dir, "keep-serving.js")
	if err := os.WriteFile(preload, []byte(dynaliteKeepServing), 0o644); err != nil {
		return nil, port, fmt.Errorf("testenv: dynalite: %w", err)
	}
	proc, err := StartProc(ProcConfig{
		Name: "dynalite",
		Path: node,
		Args: []string{"--require", preload, cli,
			"--host", "127.0.0.1",
			"--port", strconv.Itoa(port),
			"--createTableMs", "0",
			"--deleteTableMs", "0",
			"--updateTableMs", "0",
		},
		Dir:         dir,
		StopTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, port, err
	}
	ctx, cancel := context.WithTimeout(ctx, dynaliteStartTimeout)
	defer cancel()
	err = proc.WaitReady(ctx, func(ctx context.Context) error {
		return probeDynalite(ctx, proc, port)
	})
	if err != nil {
		_ = proc.Stop()
		return proc, port, err
	}
	return proc, port, nil
}

// probeDynalite checks that this process bound the port (it prints its
// address once listening, so a server of another process on the same port
// cannot pass) and that it answers a ListTables request.
func probeDynalite(ctx context.Context, proc *Proc, port int) error {
	want := "Dynalite listening at: http://127.0.0.1:" + strconv.Itoa(port)
	if !strings.Contains(proc.Tail(20), want) {
		return errors.New("not listening yet")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return listTables(ctx, dynaliteEndpoint(port))
}

// listTables sends a ListTables request to endpoint on a connection of its
// own.
func listTables(ctx context.Context, endpoint string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewBufferString("{}"))
	if err != nil {
		return err
	}
	// dynalite checks that a request is signed but not the signature.
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=testenv/20200101/"+DynaliteRegion+"/dynamodb/aws4_request, SignedHeaders=host;x-amz-date;x-amz-target, Signature=0")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ListTables: HTTP %d: %s", resp.StatusCode, body)
	}
	return nil
}

// dynalitePortTaken reports whether the exited dynalite failed because its
// port was in use.
func dynalitePortTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	return strings.Contains(proc.Tail(40), "EADDRINUSE")
}

func dynaliteEndpoint(port int) string {
	return "http://127.0.0.1:" + strconv.Itoa(port)
}

// dynaliteCLI returns the path of dynalite's cli.js under root's
// node_modules, root defaulting to the module root found from the working
// directory.
func dynaliteCLI(root string) (string, error) {
	if root == "" {
		var err error
		if root, err = moduleRoot(); err != nil {
			return "", err
		}
	}
	cli := filepath.Join(root, "node_modules", "dynalite", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		return "", fmt.Errorf("testenv: dynalite is not installed (%s missing): %s", cli, dynaliteInstallHint)
	}
	return cli, nil
}

// moduleRoot walks up from the working directory (a package directory when
// running tests) to the directory holding go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("testenv: no go.mod in %s or its parents: run from inside the repository", wd)
		}
	}
}

// sharedDynalite is the test process's dynalite server; its value is the
// endpoint URL.
var sharedDynalite lazy[string]

// Dynalite returns the endpoint (http://127.0.0.1:PORT, region
// [DynaliteRegion], any credentials) of the test process's dynalite server,
// started on first use from the repository's node_modules and stopped by
// Main, which must run the package's tests. Tests isolate themselves with
// tables of their own (named with [Name]) and delete them when done.
//
// If dynalite cannot be started (for instance because node_modules is
// missing: the error says to run `npm ci` in the repository root),
// Dynalite calls t.Fatalf.
func Dynalite(t testing.TB) string {
	t.Helper()
	requireMain(t)
	endpoint, err := sharedDynalite.get(func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), dynaliteStartTimeout)
		defer cancel()
		var logf func(string, ...any)
		if testing.Verbose() {
			logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		}
		endpoint, _, err := StartDynalite(ctx, DynaliteOptions{Logf: logf})
		return endpoint, err
	})
	if err != nil {
		t.Fatalf("testenv: dynalite: %v", err)
	}
	return endpoint
}
