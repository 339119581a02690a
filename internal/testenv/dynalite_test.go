package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartDynalite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), dynaliteStartTimeout)
	defer cancel()
	endpoint, stop, err := StartDynalite(ctx, DynaliteOptions{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	port, ok := strings.CutPrefix(endpoint, "http://127.0.0.1:")
	if _, err := strconv.Atoi(port); !ok || err != nil {
		t.Fatalf("endpoint %q: want http://127.0.0.1:PORT", endpoint)
	}
	probeCtx, probeCancel := context.WithTimeout(ctx, 5*time.Second)
	defer probeCancel()
	if err := listTables(probeCtx, endpoint); err != nil {
		t.Fatalf("ListTables on %s: %v", endpoint, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if err := listTables(probeCtx, endpoint); err == nil {
		t.Fatalf("dynalite still answers on %s after stop", endpoint)
	}
}

// A client that closes its connection in the middle of a request (its
// context ended) must not take dynalite down for the tests after it.
func TestDynaliteSurvivesAbortedRequest(t *testing.T) {
	endpoint := Dynalite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	// Headers promising a body, half of it, then gone.
	_, err = fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: dynalite\r\nContent-Type: application/x-amz-json-1.0\r\n"+
		"X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{\"Limit\"")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := listTables(ctx, endpoint); err != nil {
			t.Fatalf("ListTables %d after an aborted request: %v", i+1, err)
		}
	}
}

func TestStartDynaliteMissingModule(t *testing.T) {
	_, _, err := StartDynalite(context.Background(), DynaliteOptions{ModuleRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "npm ci") {
		t.Fatalf("StartDynalite without node_modules: got %v, want an error telling to run npm ci", err)
	}
}

func TestDynaliteShared(t *testing.T) {
	a := Dynalite(t)
	b := Dynalite(t)
	if a != b {
		t.Fatalf("Dynalite returned %q then %q; want one server per process", a, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := listTables(ctx, a); err != nil {
		t.Fatal(err)
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "module github.com/outboxrelay/outbox") {
		t.Fatalf("moduleRoot = %q, whose go.mod is not this module's", root)
	}
}
