package outboxprom

import "time"

// SetHorizonReadEvery sets how often the horizon collectors read at most,
// and returns a func restoring it.
func SetHorizonReadEvery(d time.Duration) (restore func()) {
	old := horizonReadEvery
	horizonReadEvery = d
	return func() { horizonReadEvery = old }
}
