package testenv

import (
	"context"
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
