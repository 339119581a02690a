package servers

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

func TestRegistryStopsMostRecentFirst(t *testing.T) {
	var r registry
	var order []string
	boom := errors.New("boom")
	stopFirst := r.add("first", func() error { order = append(order, "first"); return boom })
	r.add("second", func() error { order = append(order, "second"); return nil })
	r.add("third", func() error { order = append(order, "third"); return nil })

	err := r.stopAll()
	if want := []string{"third", "second", "first"}; !slices.Equal(order, want) {
		t.Errorf("stopped %q, want %q", order, want)
	}
	if !errors.Is(err, boom) || err.Error() != "first: boom" {
		t.Errorf("stopAll = %v, want first: boom wrapping the stop error", err)
	}
	if err := stopFirst(); !errors.Is(err, boom) {
		t.Errorf("owner's stop after stopAll = %v, want the first result", err)
	}
	if err := r.stopAll(); err != nil || len(order) != 3 {
		t.Errorf("second stopAll = %v and stopped %q again, want nothing to do", err, order[3:])
	}
}

func TestRegistryOwnerStopUnregisters(t *testing.T) {
	var r registry
	calls := 0
	stop := r.add("server", func() error { calls++; return nil })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.stopAll(); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("stop function ran %d times, want once", calls)
	}
}

func TestRegistryConcurrentStops(t *testing.T) {
	var r registry
	var mu sync.Mutex
	calls := 0
	stop := r.add("server", func() error { mu.Lock(); calls++; mu.Unlock(); return nil })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = stop() })
	}
	wg.Go(func() { _ = r.stopAll() })
	wg.Wait()
	if calls != 1 {
		t.Errorf("stop function ran %d times, want once", calls)
	}
}
