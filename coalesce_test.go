package outbox

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
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
			if got := c.do(context.Background(), i); got != 2*i {
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
