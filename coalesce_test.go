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
