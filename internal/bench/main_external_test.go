package bench_test

import (
	"os"
	"testing"

	"github.com/outboxrelay/outbox/internal/bench"
	"github.com/outboxrelay/outbox/internal/cli"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestMain runs the outbox command line when the bench started this binary
// as its relay or broker process (os.Executable is the test binary), and
// the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(bench.TestChildEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	testenv.Main(m)
}
