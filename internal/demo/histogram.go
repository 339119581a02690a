package demo

import (
	"math"
	"sync"
	"time"
)

// Latency histogram: logarithmic buckets from histMin, each histRatio times
// wider than the previous one, so quantiles are within 2% whatever the run
// length, in constant memory.
const (
	histMin     = time.Microsecond
	histRatio   = 1.02
	histBuckets = 1200 // up to histMin × 1.02^1200 ≈ 6 days
)

var logRatio = math.Log(histRatio)

// histogram counts durations. It is safe for concurrent use.
type histogram struct {
	mu     sync.Mutex
	counts [histBuckets]int64
	n      int64
}

func bucketOf(d time.Duration) int {
	if d <= histMin {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(histMin)) / logRatio))
	return min(i, histBuckets-1)
}

// upper returns the upper bound of bucket i.
func upper(i int) time.Duration {
	return time.Duration(float64(histMin) * math.Pow(histRatio, float64(i)))
}

func (h *histogram) add(d time.Duration) {
	i := bucketOf(d)
	h.mu.Lock()
	h.counts[i]++
	h.n++
	h.mu.Unlock()
}

// quantile returns the upper bound of the bucket holding the q-quantile, or
// 0 when nothing was counted.
func (h *histogram) quantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return upper(i)
		}
	}
	return upper(histBuckets - 1)
}
