package outbox

import (
	"runtime"
	"sync"
	"testing"
)

// A pool runs every function, never waits for a busy goroutine (blocked
// functions run side by side), reuses a goroutine that finished (the
// second of two sequential runs starts no goroutine: the loop takes it),
// and runs functions after stop too, on goroutines that then leave (the
// package's TestMain checks that none is left).
func TestGoPoolRunsEveryFunction(t *testing.T) {
	g := newGoPool()
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(3)
	var finished sync.WaitGroup
	finished.Add(3)
	for range 3 {
		g.run(func() {
			started.Done()
			<-release
			finished.Done()
		})
	}
	started.Wait() // all three run at once: none waited for another
	close(release)
	finished.Wait()

	ran := make(chan struct{})
	g.run(func() { close(ran) })
	<-ran
	reused := false
	for range 1000 { // a goroutine that finished waits for the next function
		select {
		case g.jobs <- func() {}:
			reused = true
		default:
		}
		if reused {
			break
		}
		runtime.Gosched()
	}
	if !reused {
		t.Fatal("no goroutine of the pool waited for a function after its own returned")
	}

	g.stop()
	after := make(chan struct{})
	g.run(func() { close(after) })
	<-after
	var nilPool *goPool
	viaNil := make(chan struct{})
	nilPool.run(func() { close(viaNil) })
	<-viaNil
}
