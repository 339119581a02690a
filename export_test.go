package outbox

import "time"

// SetMarkedSweepInterval changes the least time between sweeps with a
// store that has marks, for tests; it returns a function restoring it.
func SetMarkedSweepInterval(d time.Duration) (restore func()) {
	old := markedSweepInterval
	markedSweepInterval = d
	return func() { markedSweepInterval = old }
}
