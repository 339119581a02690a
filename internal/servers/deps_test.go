package servers_test

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// binaryPkg is the package of the `outbox` binary.
const binaryPkg = "github.com/outboxrelay/outbox/cmd/outbox"

// testOnlyPkgs must not be linked into the `outbox` binary. The CLI's demo and
// bench start their servers through this package, which is why it must not
// import them either.
var testOnlyPkgs = []string{
	"testing",
	"github.com/twmb/franz-go/pkg/kfake",
	"github.com/outboxrelay/outbox/internal/testenv",
	"go.uber.org/goleak",
}

// TestBinaryLinksNoTestHelpers fails if the `outbox` binary depends on a test
// helper, and names the packages that import it.
func TestBinaryLinksNoTestHelpers(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the dependencies of %s, and is not in $PATH: %v", binaryPkg, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One line per dependency: its import path, then the paths it imports.
	cmd := exec.CommandContext(ctx, goTool, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", binaryPkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", binaryPkg, err, stderr.Bytes())
	}

	deps := map[string][]string{} // package → its imports
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) > 0 {
			deps[fields[0]] = fields[1:]
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s lists only %d packages:\n%s", binaryPkg, len(deps), out)
	}
	for _, bad := range testOnlyPkgs {
		if _, ok := deps[bad]; !ok {
			continue
		}
		var importers []string
		for pkg, imports := range deps {
			if slices.Contains(imports, bad) {
				importers = append(importers, pkg)
			}
		}
		slices.Sort(importers)
		t.Errorf("%s links %s, a test-only package, imported by %s; the CLI must start servers with internal/servers, not internal/testenv",
			binaryPkg, bad, strings.Join(importers, ", "))
	}
}
