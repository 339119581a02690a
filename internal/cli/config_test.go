package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// writeConfig writes a configuration file for the test.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "outbox.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// setting returns the value and source of key in --print-config output.
func setting(t *testing.T, out, key string) (value, source string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `\s+(\S+)\s+(.+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--print-config shows no %s:\n%s", key, out)
	}
	return m[1], strings.TrimSpace(m[2])
}

func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, `# relay settings
workers: 3
batch: 7
log-level: debug
broker: nats://127.0.0.1:4222
timeout: 5s # a key of migrate: ignored by relay
`)
	for _, tc := range []struct {
		name      string
		vars      map[string]string
		args      []string
		batch     string
		source    string
		configVia string
	}{
		{"file", nil, nil, "7", "file line 3", "flag"},
		{"env beats file", map[string]string{"OUTBOX_BATCH": "9"}, nil, "9", "env OUTBOX_BATCH", "flag"},
		{"flag beats env", map[string]string{"OUTBOX_BATCH": "9"}, []string{"--batch", "11"}, "11", "flag", "flag"},
		{"OUTBOX_CONFIG", map[string]string{"OUTBOX_CONFIG": cfg}, nil, "7", "file line 3", "env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"relay", "--print-config"}, tc.args...)
			if tc.configVia == "flag" {
				args = append(args, "--config", cfg)
			}
			out := mustRun(t, tc.vars, args...).stdout
			if v, src := setting(t, out, "batch"); v != tc.batch || src != tc.source {
				t.Errorf("batch = %s from %q; want %s from %q\n%s", v, src, tc.batch, tc.source, out)
			}
			if v, src := setting(t, out, "workers"); v != "3" || src != "file line 2" {
				t.Errorf("workers = %s from %q; want 3 from the file's line 2", v, src)
			}
			if v, src := setting(t, out, "log-level"); v != "debug" || src != "file line 4" {
				t.Errorf("log-level = %s from %q; want debug from the file's line 4", v, src)
			}
			if v, src := setting(t, out, "max-attempts"); v != "10" || src != "default" {
				t.Errorf("max-attempts = %s from %q; want the default 10", v, src)
			}
			if !strings.Contains(out, "config file "+cfg) {
				t.Errorf("--print-config does not name the file:\n%s", out)
			}
		})
	}
}

func TestConfigFileMistakesExitTwoNamingKeyAndLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", "workers: 2\nwrokers: 3\n", `line 2: unknown key "wrokers"; keys are the flag names without the dashes (see outbox <command> --help); did you mean "workers"?`},
		{"wrong type", "workers: 2\n\nbatch: lots\n", `line 3: batch: "lots" is not valid: want an integer`},
		{"wrong duration", "publish-timeout: 10\n", `line 1: publish-timeout: "10" is not valid: want a duration such as 10s`},
		{"list", "broker:\n  - nats://a:4222\n", `line 1: broker must be a single value, got a list`},
		{"nested", "nats:\n  token: x\n", `line 1: unknown key "nats"`},
		{"yes", "yes: true\n", `line 1: "yes" can only be given on the command line`},
		{"duplicate", "workers: 1\nworkers: 2\n", `line 2:`},
		{"not a mapping", "- workers\n", `line 1: want a mapping of flag names to values`},
		{"syntax", "workers: [\n", `config file`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeConfig(t, tc.body)
			r := run(t, nil, "relay", "--config", cfg, "--store", "postgres://localhost/x", "--broker", "nats://localhost:4222")
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("want exit 2 and one line with %q; got %v", tc.want, r)
			}
			if !strings.Contains(r.stderr, cfg) {
				t.Fatalf("the error does not name the file %s: %s", cfg, r.stderr)
			}
		})
	}
	r := run(t, nil, "status", "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if r.code != 2 || !strings.Contains(r.stderr, "--config") || !strings.Contains(r.stderr, "missing.yaml") {
		t.Fatalf("missing file: %v", r)
	}
}

func TestConfigEnvMistakeNamesVariable(t *testing.T) {
	t.Parallel()
	r := run(t, map[string]string{"OUTBOX_WORKERS": "many"}, "relay", "--print-config")
	if r.code != 2 || !strings.Contains(r.stderr, `OUTBOX_WORKERS="many" is not a valid value for --workers`) {
		t.Fatalf("%v", r)
	}
}

func TestConfigFileDrivesMigrate(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	cfg := writeConfig(t, "store: "+dsn+"\npartitions: 4\n")
	r := mustRun(t, nil, "migrate", "--config", cfg)
	if !strings.Contains(r.stdout, "(4 partitions)") {
		t.Fatalf("migrate with the store from the file: %v", r)
	}
}
