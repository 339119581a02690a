package testenv

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

// mainActive records that the test binary runs through Main, so that shared
// servers started during the tests are guaranteed to be stopped.
var mainActive atomic.Bool

// Main runs the package's tests, stops every server this process started, and
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

	if err := stopAll(); err != nil {
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

// exitFuncs holds the stop functions of the servers still running, keyed by
// registration order.
var exitFuncs struct {
	mu   sync.Mutex
	next int
	m    map[int]exitFunc
}

type exitFunc struct {
	name string
	fn   func() error
}

// atExit registers fn, which stops the server called name, to be run by Main
// after the tests. It returns a stop function that runs fn at most once and
// unregisters it; Main and the server's owner may both call it, in any order
// and concurrently. Errors are prefixed with name.
func atExit(name string, fn func() error) (stop func() error) {
	exitFuncs.mu.Lock()
	defer exitFuncs.mu.Unlock()
	if exitFuncs.m == nil {
		exitFuncs.m = make(map[int]exitFunc)
	}
	id := exitFuncs.next
	exitFuncs.next++
	once := sync.OnceValue(func() error {
		exitFuncs.mu.Lock()
		delete(exitFuncs.m, id)
		exitFuncs.mu.Unlock()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
	exitFuncs.m[id] = exitFunc{name: name, fn: once}
	return once
}

// stopAll stops every registered server, most recently started first, and
// returns the joined errors.
func stopAll() error {
	exitFuncs.mu.Lock()
	ids := slices.Sorted(maps.Keys(exitFuncs.m))
	fns := maps.Clone(exitFuncs.m)
	exitFuncs.mu.Unlock()

	var errs []error
	for _, id := range slices.Backward(ids) {
		if err := fns[id].fn(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lazy is a process-wide server started on first use. The start function is
// expected to register the server's stop function with atExit, so that Main
// stops it. A failed start is not retried: every caller gets the same error.
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
