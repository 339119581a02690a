package cli_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestConsoleUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	short := filepath.Join(dir, "short-token")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const (
		lite = "sqlite:///nonexistent/dir/outbox.db" // never opened: the checks come first
		pg   = "postgres://outbox@127.0.0.1:1/app"
		nats = "nats://127.0.0.1:1"
	)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"beyond loopback without auth", []string{"console", "--store", lite, "--http-addr", "0.0.0.0:0"}, []string{"--http-addr 0.0.0.0:0 listens beyond loopback", "--basic-auth-file", "--token-file"}},
		{"every interface without auth", []string{"console", "--store", lite, "--http-addr", ":9080"}, []string{"beyond loopback"}},
		{"short token", []string{"console", "--store", lite, "--token-file", short}, []string{"--token-file", "at least 16"}},
		{"missing password file", []string{"console", "--store", lite, "--basic-auth-file", filepath.Join(dir, "nope")}, []string{"--basic-auth-file", "password file"}},
		{"relay console without http", []string{"relay", "--store", pg, "--broker", nats, "--console", "--http-addr", ""}, []string{"--console needs --http-addr"}},
		{"relay console beyond loopback", []string{"relay", "--store", pg, "--broker", nats, "--console", "--http-addr", "0.0.0.0:0"}, []string{"beyond loopback", "--console-basic-auth-file"}},
	} {
		r := run(t, nil, tc.args...)
		if r.code != 2 {
			t.Errorf("%s: exit %d, want 2\n%v", tc.name, r.code, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr lacks %q:\n%s", tc.name, w, r.stderr)
			}
		}
	}
}

// TestConsoleCommandServes runs `outbox console` on a SQLite outbox, with
// and without authentication.
func TestConsoleCommandServes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := "sqlite://" + filepath.Join(dir, "outbox.db")
	mustRun(t, nil, "migrate", "--store", store)

	b := start(t, nil, "console", "--store", store, "--http-addr", "127.0.0.1:0", "--read-only", "--log-format", "json")
	addr := httpAddrFromLog(t, b)
	for _, page := range []string{"/", "/partitions", "/dead-letters", "/find?q=k"} {
		code, body := httpGet(t, "http://"+addr+page)
		if code != http.StatusOK || !strings.Contains(body, `<span class="tag">sqlite</span>`) || !strings.Contains(body, `id="read-only"`) {
			t.Errorf("GET %s: %d\n%s", page, code, body)
		}
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("console exited %d:\n%s", code, b.stderr)
	}

	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("ops:correct-horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b = start(t, nil, "console", "--store", store, "--http-addr", "0.0.0.0:0", "--basic-auth-file", passwd, "--log-format", "json")
	addr = httpAddrFromLog(t, b)
	port := addr[strings.LastIndex(addr, ":"):]
	if code, _ := httpGet(t, "http://127.0.0.1"+port+"/"); code != http.StatusUnauthorized {
		t.Errorf("GET / without credentials: %d, want 401", code)
	}
	if code, body := httpGet(t, "http://ops:correct-horse@127.0.0.1"+port+"/"); code != http.StatusOK || !strings.Contains(body, `<span class="user">ops</span>`) {
		t.Errorf("GET / as ops: %d\n%s", code, body)
	}
	if log := b.stderr.String(); strings.Contains(log, "correct-horse") {
		t.Errorf("the log prints the password:\n%s", log)
	}
}

// TestRelayConsole runs `outbox relay --console`: the console beside
// /metrics, with the relay of the process.
func TestRelayConsole(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	stream(t, ns, "orders.>")
	node := "relay-" + testenv.Name(t)
	b := start(t, nil, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--node", node, "--http-addr", "127.0.0.1:0",
		"--console", "--log-format", "json", "--poll-interval", "50ms")
	addr := httpAddrFromLog(t, b)
	code, body := httpGet(t, "http://"+addr+"/")
	if code != http.StatusOK || !strings.Contains(body, "relay "+node) || !strings.Contains(body, `id="this-relay"`) {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	if code, body := httpGet(t, "http://"+addr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics beside the console: %d", code)
	}
	if code, _ := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz beside the console: %d", code)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
}
