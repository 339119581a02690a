// Package deploy_test checks the deployment files: it runs the Dockerfile's
// own `go build` line (no Docker engine is needed) and checks that the
// binary is static, runs, and reports its version; it verifies the systemd
// unit with systemd-analyze; and it checks that the example environment and
// configuration files are accepted by `outbox relay --print-config`.
package deploy_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// buildLineRe finds the Dockerfile's build command.
var buildLineRe = regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .*) -o /out/outbox ./cmd/outbox$`)

// buildFromDockerfile runs the Dockerfile's go build line with VERSION and
// REVISION set, writing the binary into a directory of the test.
func buildFromDockerfile(t *testing.T) string {
	t.Helper()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := buildLineRe.FindSubmatch(df)
	if m == nil {
		t.Fatal("Dockerfile has no line `RUN CGO_ENABLED=0 go build … -o /out/outbox ./cmd/outbox`")
	}
	bin := filepath.Join(t.TempDir(), "outbox")
	cmd := exec.CommandContext(t.Context(), "sh", "-c", string(m[1])+` -o "$OUT" ./cmd/outbox`)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION=v9.8.7-test", "REVISION=0123456789abcdef0123456789abcdef01234567", "OUT="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build line failed: %v\n%s", err, out)
	}
	return bin
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(df)
	stages := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(text, -1)
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages; want a build stage and a runtime stage", len(stages))
	}
	final := text[stages[len(stages)-1][0]:]
	for _, want := range []string{"FROM gcr.io/distroless/static", "USER 65532:65532", "COPY --from=build /out/outbox", `ENTRYPOINT ["/usr/local/bin/outbox"]`} {
		if !strings.Contains(final, want) {
			t.Errorf("the runtime stage lacks %q", want)
		}
	}
	if strings.Contains(final, "RUN ") {
		t.Error("the runtime stage runs commands; it has no shell")
	}

	bin := buildFromDockerfile(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary has a dynamic loader (PT_INTERP): it is not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) != 0 {
		t.Fatalf("the binary needs shared libraries %v (%v)", libs, err)
	}

	out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "outbox v9.8.7-test (commit 0123456789ab") || !strings.Contains(string(out), "tags outbox_slim") {
		t.Fatalf("outbox version: %v\n%s", err, out)
	}
	out, err = exec.CommandContext(t.Context(), bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "relay") || strings.Contains(string(out), "demo") || strings.Contains(string(out), "bench") {
		t.Fatalf("the slim binary's commands: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("static slim relay binary: %.1f MB", float64(fi.Size())/1e6)

	// The example environment and configuration files are accepted.
	env := []string{"PATH=" + os.Getenv("PATH")}
	envFile, err := os.ReadFile("relay.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(envFile), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			env = append(env, line)
		}
	}
	for _, args := range [][]string{{"relay", "--print-config"}, {"relay", "--print-config", "--config", "relay.yaml"}} {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "env OUTBOX_BROKER") && len(args) == 2 {
			t.Fatalf("outbox %s with relay.env: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is missing: install it with `apt-get install -y systemd` (scripts/test.sh does)")
	}
	unit, err := os.ReadFile("outbox-relay.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes", "RestartPreventExitStatus=2", "EnvironmentFile=/etc/outbox/relay.env", "ExecStart=/usr/local/bin/outbox relay"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	// systemd-analyze verify checks that ExecStart's program exists: point
	// it at a binary that does.
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox-relay.service")
	text := strings.Replace(string(unit), "ExecStart=/usr/local/bin/outbox relay", "ExecStart="+bin+" relay", 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), analyze, "verify", "--man=no", path)
	out, err := cmd.CombinedOutput()
	// verify prints warnings about the host (no systemd running in a
	// container, other units); only lines about our unit count.
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "outbox-relay.service") {
			ours = append(ours, line)
		}
	}
	if err != nil || len(ours) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	sec, err := exec.CommandContext(t.Context(), analyze, "security", "--offline=true", "--no-pager", path).CombinedOutput()
	if err != nil && len(sec) == 0 {
		t.Fatalf("systemd-analyze security: %v", err)
	}
	if m := regexp.MustCompile(`Overall exposure level for outbox-relay.service: ([0-9.]+) (\S+)`).FindSubmatch(sec); m != nil {
		t.Logf("systemd-analyze security: exposure %s %s", m[1], m[2])
		if exposure, err := strconv.ParseFloat(string(m[1]), 64); err != nil || exposure > 2 {
			t.Errorf("exposure %s; want 2.0 or lower\n%s", m[1], sec)
		}
	}
}
