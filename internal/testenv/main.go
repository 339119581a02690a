package testenv

import (
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outbox/internal/servers"
)

// mainActive records that the test binary runs through Main, so that shared
// servers started during the tests are guaranteed to be stopped.
var mainActive atomic.Bool

// Main runs the package's tests, stops every server this process started
// (with this package or with internal/servers: see [servers.StopAll]), and
// checks for leaked goroutines with go.uber.org/goleak. Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Goroutines already running when Main is called (started by package init
// functions) are not reported. The leak check only runs when all tests passed,
// and a failure to stop a server fails the binary. Main does not return: it
// calls os.Exit with the tests' exit code (1 if stopping or the leak check
// failed).
func Main(m *testing.M) {
	mainActive.Store(true)
	preexisting := goleak.IgnoreCurrent()

	code := m.Run()

	if err := servers.StopAll(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		// Keep-alive connections of the default HTTP client are not leaks of
		// the code under test.
		if tr, ok := http.DefaultTransport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		if err := goleak.Find(preexisting); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// requireMain fails t unless the test binary runs through Main, which is what
// stops the shared, process-wide servers.
func requireMain(t testing.TB) {
	t.Helper()
	if !mainActive.Load() {
		t.Fatalf("testenv: shared servers need the package's tests to run through testenv.Main; add\n\tfunc TestMain(m *testing.M) { testenv.Main(m) }")
	}
}

// lazy is a process-wide server started on first use. The start function is
// expected to register the server's stop function with servers.AtExit, so
// that Main stops it. A failed start is not retried: every caller gets the
// same error.
type lazy[T any] struct {
	once sync.Once
	val  T
	err  error
}

// get starts the server on the first call and returns its value (or start
// error) on every call.
func (l *lazy[T]) get(start func() (T, error)) (T, error) {
	l.once.Do(func() { l.val, l.err = start() })
	return l.val, l.err
}
