package servers

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// running is the process-wide registry of the servers still running, used by
// AtExit and StopAll.
var running registry

// AtExit registers fn, which stops the server called name, to be run by
// [StopAll]. It returns a stop function that runs fn at most once and
// unregisters it; StopAll and the server's owner may both call it, in any
// order and concurrently, and every call returns the first call's result.
// Errors are prefixed with name.
//
// Every starter of this package registers its server this way, and so must a
// new one (see the package documentation), so that testenv.Main, which calls
// StopAll after the tests, stops every server a test binary started.
func AtExit(name string, fn func() error) (stop func() error) {
	return running.add(name, fn)
}

// StopAll stops every server registered with [AtExit] and not stopped yet,
// most recently started first, one at a time, and returns their errors
// joined. Servers started while StopAll runs are not stopped. It is safe to
// call at any time and from any goroutine; a server stopped by StopAll is
// unregistered, so a second call only stops servers started since.
func StopAll() error {
	return running.stopAll()
}

// registry holds the stop functions of running servers, keyed by
// registration order. The zero value is empty and ready to use.
type registry struct {
	mu   sync.Mutex
	next int
	m    map[int]func() error // stop functions, as returned by add
}

// add implements AtExit on r.
func (r *registry) add(name string, fn func() error) (stop func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[int]func() error)
	}
	id := r.next
	r.next++
	once := sync.OnceValue(func() error {
		r.mu.Lock()
		delete(r.m, id)
		r.mu.Unlock()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
	r.m[id] = once
	return once
}

// stopAll implements StopAll on r.
func (r *registry) stopAll() error {
	r.mu.Lock()
	ids := slices.Sorted(maps.Keys(r.m))
	stops := maps.Clone(r.m)
	r.mu.Unlock()

	var errs []error
	for _, id := range slices.Backward(ids) {
		if err := stops[id](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
