package outbox

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Probing a blocked destination: the first probe comes after
// blockedProbeMin, then with exponential backoff (and jitter) up to
// blockedProbeMax, whatever the message backoff: recovery after an
// operator fixes the destination takes seconds, not minutes.
const (
	blockedProbeMin = 100 * time.Millisecond
	blockedProbeMax = 5 * time.Second
	// blockedLogEvery rate-limits the log line of a destination that stays
	// blocked.
	blockedLogEvery = 30 * time.Second
)

// BlockedDestination describes a destination the relay has paused because
// the broker refused it as a whole (see [BlockedError]).
type BlockedDestination struct {
	Destination string    `json:"destination"`
	Since       time.Time `json:"since"`
	LastError   string    `json:"last_error"`
	// Probes counts the failed attempts to publish to it since Since.
	Probes    int       `json:"probes"`
	NextProbe time.Time `json:"next_probe"`
}

// destinations is the relay's record of blocked destinations, shared by its
// workers: one probe at a time per destination, relay-wide, every record of
// the destination held until it works again.
type destinations struct {
	n    atomic.Int32 // how many are blocked: the fast path checks it
	mu   sync.Mutex
	m    map[string]*destState
	log  *slog.Logger
	emit func(Event)
	wake func() // wakes every worker when a destination works again
	// probeStale is when a probe whose result never came (its worker lost
	// the lease, or was killed) stops holding the next one.
	probeStale time.Duration
}

type destState struct {
	BlockedDestination
	probing    bool // a probe is in flight
	probeStart time.Time
	lastLog    time.Time
}

func newDestinations(log *slog.Logger, emit func(Event), publishTimeout time.Duration) *destinations {
	return &destinations{m: map[string]*destState{}, log: log, emit: emit, wake: func() {}, probeStale: publishTimeout + blockedProbeMax}
}

// hold reports until when a record for topic must wait: zero when it may
// go now. With claim, a record of a blocked destination whose probe is due
// becomes the probe (and may go).
func (d *destinations) hold(topic string, now time.Time, claim bool) time.Time {
	if d.n.Load() == 0 {
		return time.Time{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.m[topic]
	if s == nil {
		return time.Time{}
	}
	if until := d.waitLocked(s, now); !until.IsZero() {
		return until
	}
	if claim {
		s.probing, s.probeStart = true, now
		return time.Time{}
	}
	return now
}

// paused returns the blocked destinations whose records must not be
// claimed now: no probe of theirs is due (ordering none claims the others,
// and takes a paused destination's records again when its probe is due).
func (d *destinations) paused(now time.Time) []string {
	if d.n.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for topic, s := range d.m {
		if !d.waitLocked(s, now).IsZero() {
			out = append(out, topic)
		}
	}
	return out
}

// waitLocked returns until when blocked destination s must wait (a probe
// in flight, or its next probe not due), or zero when its probe may go.
func (d *destinations) waitLocked(s *destState, now time.Time) time.Time {
	if s.probing && now.Sub(s.probeStart) < d.probeStale {
		return now.Add(blockedProbeMax) // the probe's result wakes the workers
	}
	if now.Before(s.NextProbe) {
		return s.NextProbe
	}
	return time.Time{}
}

// isBlocked reports whether topic is blocked now.
func (d *destinations) isBlocked(topic string) bool {
	if d.n.Load() == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[topic] != nil
}

// blocked records a publish refused for its destination.
func (d *destinations) blocked(topic string, err error, now time.Time) {
	d.mu.Lock()
	s := d.m[topic]
	first := s == nil
	if first {
		s = &destState{BlockedDestination: BlockedDestination{Destination: topic, Since: now}}
		d.m[topic] = s
		d.n.Add(1)
	}
	s.probing = false
	s.Probes++
	s.LastError = err.Error()
	s.NextProbe = now.Add(Backoff(s.Probes, blockedProbeMin, blockedProbeMax))
	logIt := first || now.Sub(s.lastLog) >= blockedLogEvery
	if logIt {
		s.lastLog = now
	}
	snap := s.BlockedDestination
	d.mu.Unlock()
	if first {
		d.emit(Event{Kind: EventBlocked, Topic: topic, Err: err})
	}
	if logIt {
		d.log.Warn("destination blocked: its messages wait, no attempts spent, other destinations go on",
			"destination", topic, "since", snap.Since, "probes", snap.Probes, "next_probe", snap.NextProbe, "err", err)
	}
}

// reached records that a publish to topic reached the broker (whatever its
// outcome for the message): a blocked destination works again.
func (d *destinations) reached(topic string) {
	if d.n.Load() == 0 {
		return
	}
	d.mu.Lock()
	s := d.m[topic]
	if s != nil {
		delete(d.m, topic)
		d.n.Add(-1)
	}
	d.mu.Unlock()
	if s == nil {
		return
	}
	d.log.Info("destination works again", "destination", topic, "blocked_for", time.Since(s.Since).Round(time.Millisecond), "probes", s.Probes)
	d.emit(Event{Kind: EventUnblocked, Topic: topic, Duration: time.Since(s.Since)})
	d.wake()
}

// unprobe ends a probe that was claimed but never sent.
func (d *destinations) unprobe(topic string) {
	if d.n.Load() == 0 {
		return
	}
	d.mu.Lock()
	if s := d.m[topic]; s != nil {
		s.probing = false
	}
	d.mu.Unlock()
}

// list returns the blocked destinations, by name.
func (d *destinations) list() []BlockedDestination {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]BlockedDestination, 0, len(d.m))
	for _, s := range d.m {
		out = append(out, s.BlockedDestination)
	}
	slices.SortFunc(out, func(a, b BlockedDestination) int {
		if a.Destination < b.Destination {
			return -1
		}
		if a.Destination > b.Destination {
			return 1
		}
		return 0
	})
	return out
}

// holdRecord is a partQueue's hold function.
func (d *destinations) holdRecord(rec *Record, now time.Time, claim bool) time.Time {
	return d.hold(rec.Topic, now, claim)
}
