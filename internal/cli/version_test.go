package cli_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	line := mustRun(t, nil, "version").stdout
	if !strings.HasPrefix(line, "outbox ") || !strings.Contains(line, runtime.Version()) || strings.Count(line, "\n") != 1 {
		t.Fatalf("outbox version printed %q; want one line with the Go version %s", line, runtime.Version())
	}
	if flag := mustRun(t, nil, "--version").stdout; flag != line {
		t.Fatalf("outbox --version printed %q; outbox version printed %q", flag, line)
	}
	var got struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	out := mustRun(t, nil, "version", "--json").stdout
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Version == "" || got.GoVersion != runtime.Version() {
		t.Fatalf("outbox version --json printed %q (%v)", out, err)
	}
}

func TestHTTPAddrDefaultIsNotPrometheusPort(t *testing.T) {
	t.Parallel()
	help := mustRun(t, nil, "relay", "--help").stdout
	if !strings.Contains(help, `(default "127.0.0.1:7467")`) || strings.Contains(help, "9090") {
		t.Fatalf("relay --help does not show the default --http-addr 127.0.0.1:7467:\n%s", help)
	}
}
