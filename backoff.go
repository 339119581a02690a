package outbox

import (
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before attempt number attempts+1 after attempts
// failures: exponential from min, capped at max, with jitter drawn
// uniformly between half and all of the capped delay (so concurrent
// failures spread out but never wait less than half the schedule).
func Backoff(attempts int, min, max time.Duration) time.Duration {
	if attempts < 1 {
		attempts = 1
	}
	d := min
	for i := 1; i < attempts && d < max; i++ {
		d *= 2
	}
	if d > max || d <= 0 {
		d = max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}
