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
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/servers"
)

// kinesaliteInstallHint tells how to install kinesalite: it is pinned in
// the repository's package.json and package-lock.json, next to dynalite.
const kinesaliteInstallHint = "run `npm ci` in the repository root (kinesalite)"

const (
	// kinesaliteStartTimeout bounds node's start-up plus kinesalite's
	// (opening its LevelDB directory).
	kinesaliteStartTimeout = 30 * time.Second
	// kinesalitePortAttempts is how many ports are tried when the picked
	// one turns out to be taken.
	kinesalitePortAttempts = 5
	// KinesaliteRegion is the region the endpoint accepts; kinesalite
	// accepts any region and any credentials, but clients need one.
	KinesaliteRegion = "us-east-1"
	// KinesaliteAccount is the account in kinesalite's stream ARNs.
	KinesaliteAccount = "000000000000"
)

// kinesaliteLauncher starts kinesalite on 127.0.0.1: its cli.js has no
// host option and listens on every interface. It is run as
//
//	node launcher.js KINESALITE_DIR PORT DATA_DIR
//
// with streams ACTIVE at once, a shard limit large enough for a test
// process's streams, the data in LevelDB under DATA_DIR (so that a
// restart keeps it), and a clean stop on SIGTERM. A client that gives up on
// a request mid-way (its context ended) closes the connection; the
// uncaughtException handler keeps kinesalite serving then, as Kinesis
// does (see dynaliteKeepServing).
const kinesaliteLauncher = `'use strict'
process.on('uncaughtException', function (err) {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('kinesalite: a client aborted a request: ' + err.message)
    return
  }
  console.error((err && err.stack) || err)
  process.exit(1)
})
var kinesalite = require(process.argv[2])
var port = Number(process.argv[3])
var server = kinesalite({path: process.argv[4], createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 100000})
server.on('error', function (err) {
  console.error('kinesalite: ' + err.code + ': ' + err.message)
  process.exit(1)
})
server.listen(port, '127.0.0.1', function () {
  var a = server.address()
  console.log('Kinesalite listening at http://' + a.address + ':' + a.port)
})
function stop () {
  if (server.closeAllConnections) server.closeAllConnections()
  server.close(function (err) {
    if (err) console.error('kinesalite: close: ' + err.message)
    process.exit(0)
  })
  setTimeout(function () { process.exit(0) }, 3000).unref()
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
`

// KinesaliteOptions configures StartKinesalite.
type KinesaliteOptions struct {
	// Dir is the base directory under which the server's directory (its
	// log and LevelDB data) is created; default os.TempDir().
	Dir string
	// ModuleRoot is the directory holding node_modules/kinesalite;
	// default: the nearest directory holding go.mod, from the working
	// directory up.
	ModuleRoot string
	// Logf, if not nil, receives progress messages.
	Logf func(format string, args ...any)
}

// Kinesalite is a kinesalite server (an implementation of the Kinesis
// API in Node.js, by the author of dynalite) started by StartKinesalite
// or KinesaliteServer. Its methods are safe for concurrent use.
//
// What kinesalite 3.3.3 implements, for the SDK's JSON protocol:
// CreateStream, DeleteStream, DescribeStream(Summary), ListStreams,
// ListShards, PutRecord, PutRecords (with per-record results, the 1 MiB
// record and 5 MiB request limits, and the 500 records limit),
// GetShardIterator, GetRecords, SplitShard, MergeShards and tags. It has no
// IAM (every request is allowed), never throttles (no
// ProvisionedThroughputExceededException), and knows nothing of stream
// ARNs in requests, on-demand streams, encryption or enhanced fan-out:
// the publisher's answers to those are covered by tests with scripted
// answers.
type Kinesalite struct {
	dir, dataDir, node, launcher, cli string
	port                              int
	logf                              func(format string, args ...any)

	mu   sync.Mutex
	proc *Proc
}

// Endpoint returns the server's URL, http://127.0.0.1:PORT.
func (k *Kinesalite) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(k.port) }

// StartKinesalite starts kinesalite from the repository's own node_modules
// (pinned in package.json; install with `npm ci`), for use outside of
// tests (such as `outbox bench`). Within tests use [KinesaliteServer].
//
// The server listens on 127.0.0.1 on a free port, creates and deletes
// streams at once, keeps its data in LevelDB in its own directory (so
// that Pause and Resume keep the streams and records, like a broker
// restart), and is killed if the current process dies. Any credentials and
// region are accepted (use [KinesaliteRegion]). stop stops the server and
// removes its directory; it is idempotent, and Main calls it if the caller
// has not. ctx bounds start-up.
func StartKinesalite(ctx context.Context, opts KinesaliteOptions) (server *Kinesalite, stop func() error, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	root := opts.ModuleRoot
	if root == "" {
		if root, err = moduleRoot(); err != nil {
			return nil, nil, err
		}
	}
	pkg := filepath.Join(root, "node_modules", "kinesalite")
	if _, err := os.Stat(filepath.Join(pkg, "index.js")); err != nil {
		return nil, nil, fmt.Errorf("testenv: kinesalite is not installed (%s missing): %s", filepath.Join(pkg, "index.js"), kinesaliteInstallHint)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, nil, fmt.Errorf("testenv: kinesalite needs Node.js, not found in $PATH: install it with `apt-get install -y nodejs npm`, then %s", kinesaliteInstallHint)
	}
	dir, err := NewServerDir(opts.Dir, "kinesalite", nil)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	k := &Kinesalite{dir: dir, dataDir: filepath.Join(dir, "data"), node: node, launcher: filepath.Join(dir, "launcher.js"), cli: pkg, logf: logf}
	if err := os.WriteFile(k.launcher, []byte(kinesaliteLauncher), 0o644); err != nil {
		return nil, nil, fmt.Errorf("testenv: kinesalite: %w", err)
	}
	for attempt := 1; ; attempt++ {
		if k.port, err = FreePort(); err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		proc, err := k.start(ctx)
		if err == nil {
			k.proc = proc
			logf("testenv: kinesalite: pid %d ready on 127.0.0.1:%d in %v", proc.PID(), k.port, time.Since(t0).Round(time.Millisecond))
			return k, servers.AtExit("kinesalite", k.stop), nil
		}
		if proc == nil || attempt == kinesalitePortAttempts || !kinesalitePortTaken(proc) {
			return nil, nil, err
		}
		logf("testenv: kinesalite: port %d taken, retrying with another one", k.port)
	}
}

// start starts the process on k.port and waits until it answers. On
// failure the process, if started, has been stopped and is returned for
// inspection.
func (k *Kinesalite) start(ctx context.Context) (*Proc, error) {
	proc, err := StartProc(ProcConfig{
		Name:        "kinesalite",
		Path:        k.node,
		Args:        []string{k.launcher, k.cli, strconv.Itoa(k.port), k.dataDir},
		Dir:         k.dir,
		StopTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, kinesaliteStartTimeout)
	defer cancel()
	err = proc.WaitReady(ctx, func(ctx context.Context) error {
		// This process printed its address once listening, so a server of
		// another process on the same port cannot pass.
		if !strings.Contains(proc.Tail(20), "Kinesalite listening at "+k.Endpoint()) {
			return errors.New("not listening yet")
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return listStreams(ctx, k.Endpoint())
	})
	if err != nil {
		_ = proc.Stop()
		return proc, err
	}
	return proc, nil
}

// listStreams sends a ListStreams request to endpoint on a connection of
// its own.
func listStreams(ctx context.Context, endpoint string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewBufferString("{}"))
	if err != nil {
		return err
	}
	// kinesalite checks that a request is signed but not the signature.
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	req.Header.Set("X-Amz-Target", "Kinesis_20131202.ListStreams")
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=testenv/20200101/"+KinesaliteRegion+"/kinesis/aws4_request, SignedHeaders=host;x-amz-date;x-amz-target, Signature=0")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ListStreams: HTTP %d: %s", resp.StatusCode, body)
	}
	return nil
}

// kinesalitePortTaken reports whether the exited kinesalite failed because
// its port was in use.
func kinesalitePortTaken(proc *Proc) bool {
	select {
	case <-proc.Exited():
	default:
		return false
	}
	return strings.Contains(proc.Tail(40), "EADDRINUSE")
}

// Pause stops the server (SIGTERM: it closes its connections and its
// LevelDB store, and exits); its directory stays, for Resume. Clients see
// the connection refused.
func (k *Kinesalite) Pause() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc == nil {
		return errors.New("testenv: kinesalite: server is stopped")
	}
	err := k.proc.Stop()
	k.proc = nil
	return err
}

// Resume starts a paused server again on the same port with the same
// streams and records. It returns once the server answers. ctx bounds the
// start-up.
func (k *Kinesalite) Resume(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc != nil {
		return errors.New("testenv: kinesalite: server is running")
	}
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		proc, err := k.start(ctx)
		if err == nil {
			k.proc = proc
			k.logf("testenv: kinesalite: restarted (pid %d) in %v", proc.PID(), time.Since(t0).Round(time.Millisecond))
			return nil
		}
		// The port was ours a moment ago: retry while it is still held.
		if proc == nil || attempt == kinesalitePortAttempts || !kinesalitePortTaken(proc) || ctx.Err() != nil {
			return err
		}
	}
}

// Restart is Pause then Resume.
func (k *Kinesalite) Restart(ctx context.Context) error {
	if err := k.Pause(); err != nil {
		return err
	}
	return k.Resume(ctx)
}

func (k *Kinesalite) stop() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs []error
	if k.proc != nil {
		errs = append(errs, k.proc.Stop())
		k.proc = nil
	}
	errs = append(errs, os.RemoveAll(k.dir))
	return errors.Join(errs...)
}

// sharedKinesalite is the test process's kinesalite server.
var sharedKinesalite lazy[*Kinesalite]

// KinesaliteServer returns the test process's kinesalite server (region
// [KinesaliteRegion], any credentials), started on first use from the
// repository's node_modules and stopped by Main, which must run the
// package's tests. Tests isolate themselves with streams of their own
// (named with [Name]). A test that pauses or restarts it must not run in
// parallel with the package's other tests that use it.
//
// If kinesalite cannot be started (for instance because node_modules is
// missing: the error says to run `npm ci` in the repository root),
// KinesaliteServer calls t.Fatalf.
func KinesaliteServer(t testing.TB) *Kinesalite {
	t.Helper()
	requireMain(t)
	k, err := sharedKinesalite.get(func() (*Kinesalite, error) {
		ctx, cancel := context.WithTimeout(context.Background(), kinesaliteStartTimeout)
		defer cancel()
		var logf func(string, ...any)
		if testing.Verbose() {
			logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		}
		k, _, err := StartKinesalite(ctx, KinesaliteOptions{Logf: logf})
		return k, err
	})
	if err != nil {
		t.Fatalf("testenv: kinesalite: %v", err)
	}
	return k
}
