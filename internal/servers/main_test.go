package servers_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outbox/internal/servers"
)

// TestMain does what testenv.Main does, which this package cannot use
// (internal/testenv imports it): after the tests, it stops the servers still
// registered and fails the binary if that fails or if goroutines leaked.
func TestMain(m *testing.M) {
	preexisting := goleak.IgnoreCurrent()
	code := m.Run()
	if err := servers.StopAll(); err != nil {
		fmt.Fprintf(os.Stderr, "servers: stopping servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(preexisting); err != nil {
			fmt.Fprintf(os.Stderr, "servers: goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
