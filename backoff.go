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

// RetryPolicy returns how long a message waits before its next attempt
// after attempts failed ones. Config.RetryPolicy defaults to
// ExponentialBackoff(Config.BackoffMin, Config.BackoffMax). Failures of a
// blocked destination spend no attempt and do not consult it.
type RetryPolicy func(attempts int) time.Duration

// ExponentialBackoff is the default RetryPolicy: [Backoff] from min to
// max, with jitter.
func ExponentialBackoff(min, max time.Duration) RetryPolicy {
	return func(attempts int) time.Duration { return Backoff(attempts, min, max) }
}

// retrier is the one schedule of the relay's store-call loops (lease
// rounds, fetches, settles, claims, subscriptions): exponential from
// StoreRetryMin to HeartbeatInterval, with jitter, reset by a success.
type retrier struct {
	failures int
	min, max time.Duration
}

func (r *Relay) newRetrier() retrier {
	return retrier{min: r.cfg.StoreRetryMin, max: max(r.cfg.StoreRetryMin, r.cfg.HeartbeatInterval)}
}

// failed counts a failure and returns how long to wait before the next
// call.
func (rt *retrier) failed() time.Duration {
	rt.failures++
	return Backoff(rt.failures, rt.min, rt.max)
}

// ok resets the schedule after a success.
func (rt *retrier) ok() { rt.failures = 0 }
