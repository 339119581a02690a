package outbox

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many concurrent callers each get their own result, no call is lost or
// run twice, and calls are merged into fewer rounds.
func TestCoalescerMergesAndAnswersEveryCall(t *testing.T) {
	var rounds, calls atomic.Int64
	c := coalescer[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		rounds.Add(1)
		calls.Add(int64(len(reqs)))
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r * 2
		}
		return out
	}}
	const n = 2000
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var gather time.Duration
			if i%3 == 0 {
				gather = time.Microsecond // some leaders gather
			}
			if got := c.do(context.Background(), i, gather); got != 2*i {
				t.Errorf("call %d got %d, want %d", i, got, 2*i)
			}
		})
	}
	wg.Wait()
	if calls.Load() != n {
		t.Fatalf("%d calls run, want %d", calls.Load(), n)
	}
	if c.running != 0 || len(c.pending) != 0 {
		t.Fatalf("after all calls: running %d, pending %d", c.running, len(c.pending))
	}
	t.Logf("%d calls in %d rounds", n, rounds.Load())
}

// Calls arriving while a leader gathers join its round, even with a slot
// free: the workers' timed polls make one store call.
func TestCoalescerGatherJoinsCallsDueTogether(t *testing.T) {
	var rounds atomic.Int64
	c := coalescer[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		rounds.Add(1)
		return make([]int, len(reqs))
	}}
	ctx, endGather := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.do(ctx, 0, time.Hour) }) // gathers until endGather
	waitFor := func(cond func() bool) {
		for {
			c.mu.Lock()
			ok := cond()
			c.mu.Unlock()
			if ok {
				return
			}
			runtime.Gosched()
		}
	}
	waitFor(func() bool { return c.gathering })
	for i := 1; i <= 3; i++ {
		wg.Go(func() { c.do(context.Background(), i, 0) })
	}
	waitFor(func() bool { return len(c.pending) == 4 })
	endGather()
	wg.Wait()
	if n := rounds.Load(); n != 1 {
		t.Fatalf("%d rounds, want 1: calls made while a leader gathered led their own", n)
	}
	if c.running != 0 || c.gathering {
		t.Fatalf("after all calls: running %d, gathering %v", c.running, c.gathering)
	}
}

// Every call submitted gets its own result, once, from rounds that merge
// them; no more than max rounds run at once; every call's cancel is called
// after its delivery; no round is left running.
func TestHandingDeliversEveryCallOnce(t *testing.T) {
	var rounds, calls, running, most atomic.Int64
	c := handing[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		defer running.Add(-1)
		rounds.Add(1)
		calls.Add(int64(len(reqs)))
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r * 2
		}
		runtime.Gosched()
		return out
	}}
	const n = 2000
	got := make([]atomic.Int64, n)
	var delivered, cancelled sync.WaitGroup
	delivered.Add(n)
	cancelled.Add(n)
	var submitters sync.WaitGroup
	for i := range n {
		submitters.Go(func() {
			var gather time.Duration
			if i%3 == 0 {
				gather = time.Microsecond // some leaders gather
			}
			var done atomic.Bool
			c.submit(context.Background(), func() {
				if !done.Load() {
					t.Errorf("call %d cancelled before its delivery", i)
				}
				cancelled.Done()
			}, i, gather, 0, func(res int) {
				if res != 2*i {
					t.Errorf("call %d got %d, want %d", i, res, 2*i)
				}
				got[i].Add(1)
				done.Store(true)
				delivered.Done()
			})
		})
	}
	submitters.Wait()
	delivered.Wait()
	cancelled.Wait()
	for i := range got {
		if n := got[i].Load(); n != 1 {
			t.Fatalf("call %d delivered %d times", i, n)
		}
	}
	if calls.Load() != n {
		t.Fatalf("%d calls run, want %d", calls.Load(), n)
	}
	if m := most.Load(); m > 2 {
		t.Fatalf("%d rounds ran at once, max is 2", m)
	}
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		c.mu.Lock()
		running, pending := c.running, len(c.pending)
		c.mu.Unlock()
		if running == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after every delivery: %d rounds running, %d calls pending", running, pending)
		}
	}
	t.Logf("%d calls in %d rounds", n, rounds.Load())
}

// Calls submitted while a leader gathers join its round, even with a
// round free: the workers a notification woke make one store call.
func TestHandingGatherJoinsCallsDueTogether(t *testing.T) {
	var rounds atomic.Int64
	c := handing[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		rounds.Add(1)
		return make([]int, len(reqs))
	}}
	ctx, endGather := context.WithCancel(context.Background())
	var delivered sync.WaitGroup
	delivered.Add(4)
	deliver := func(int) { delivered.Done() }
	c.submit(ctx, func() {}, 0, time.Hour, 0, deliver) // gathers until endGather
	for i := 1; i <= 3; i++ {
		c.submit(context.Background(), func() {}, i, 0, 0, deliver)
	}
	c.mu.Lock()
	pending, running := len(c.pending), c.running
	c.mu.Unlock()
	if pending != 4 || running != 1 {
		t.Fatalf("while the first leader gathers: %d pending, %d running; want 4 and 1", pending, running)
	}
	endGather()
	delivered.Wait()
	if n := rounds.Load(); n != 1 {
		t.Fatalf("%d rounds, want 1: calls made while a leader gathered led their own", n)
	}
}

// Calls submitted while max rounds run are run by a leader when its round
// ends, in one round.
func TestHandingRunsCallsPendingWhileRoundsRun(t *testing.T) {
	release := make(chan struct{})
	var rounds atomic.Int64
	started := make(chan struct{}, 3)
	c := handing[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		if rounds.Add(1) <= 2 {
			started <- struct{}{}
			<-release
		}
		return make([]int, len(reqs))
	}}
	delivered := make(chan int, 7)
	deliver := func(i int) func(int) { return func(int) { delivered <- i } }
	for i := range 2 {
		c.submit(context.Background(), func() {}, i, 0, 0, deliver(i))
		<-started // its round runs: the next call leads the other
	}
	for i := 2; i < 7; i++ {
		c.submit(context.Background(), func() {}, i, 0, 0, deliver(i))
	}
	close(release)
	seen := map[int]bool{}
	timeout := time.After(10 * time.Second)
	for len(seen) < 7 {
		select {
		case i := <-delivered:
			seen[i] = true
		case <-timeout:
			t.Fatalf("%d of 7 calls delivered: calls pending while every round ran were left", len(seen))
		}
	}
	if n := rounds.Load(); n != 3 {
		t.Fatalf("%d rounds, want 3 (the pending calls in one)", n)
	}
}

// A leader gathering for the calls of the workers a notification woke
// stops waiting as soon as they all came: with gather an hour, the round
// runs once the expected calls are pending.
func TestHandingGatherEndsWhenTheExpectedCame(t *testing.T) {
	var rounds atomic.Int64
	c := handing[int, int]{max: 2, run: func(_ context.Context, reqs []int) []int {
		rounds.Add(1)
		return make([]int, len(reqs))
	}}
	delivered := make(chan struct{}, 3)
	deliver := func(int) { delivered <- struct{}{} }
	c.submit(context.Background(), func() {}, 0, time.Hour, 3, deliver)
	c.submit(context.Background(), func() {}, 1, time.Hour, 3, deliver)
	c.mu.Lock()
	pending := len(c.pending)
	c.mu.Unlock()
	if pending != 2 {
		t.Fatalf("%d calls pending before the third came, want 2 (the leader must still wait)", pending)
	}
	c.submit(context.Background(), func() {}, 2, 0, 3, deliver)
	timeout := time.After(10 * time.Second)
	for range 3 {
		select {
		case <-delivered:
		case <-timeout:
			t.Fatal("the leader kept gathering after the three expected calls came")
		}
	}
	if n := rounds.Load(); n != 1 {
		t.Fatalf("%d rounds, want 1", n)
	}
}
