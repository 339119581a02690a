package console

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// Bounds of the overview's history and sampling.
const (
	// HistoryWindow is the span of the overview's charts.
	HistoryWindow = 10 * time.Minute
	// RefreshMinDefault is how often the overview reads the store's status
	// at most, unless Options.RefreshMin says otherwise.
	RefreshMinDefault = 2 * time.Second
	// refreshCostFactor: the status is read at most every this many times
	// the duration of the last read.
	refreshCostFactor = 5
	// liveSampleEvery is how often a Live source's totals are sampled.
	liveSampleEvery = time.Second
	// historyMax bounds the points kept per history.
	historyMax = 1200
)

// snapshot is one read of the store's status.
type snapshot struct {
	At   time.Time
	Took time.Duration
	// Status is nil when the store cannot report one or the read failed.
	Status *outbox.Status
	Err    error
}

// backlogPoint is one point of the backlog history.
type backlogPoint struct {
	At          time.Time
	Every       time.Duration // the refresh interval in force
	Outstanding int64
	DeadLetters int64
}

// livePoint is one sample of a Live source's totals.
type livePoint struct {
	At                      time.Time
	Published, Dead, Failed int64
	Leases                  int
	PublishedRate, DeadRate float64 // per second since the previous sample
	haveRate                bool
}

// overview holds the status snapshot shared by every viewer and the
// histories of the charts.
type overview struct {
	admin      outbox.AdminStore // nil: the store cannot report its status
	refreshMin time.Duration
	timeout    time.Duration
	now        func() time.Time

	mu       sync.Mutex
	cur      *snapshot
	inflight chan struct{} // closed when the read in progress ends
	backlog  []backlogPoint
	live     []livePoint
}

// refreshEvery is how old a snapshot may be before a viewer triggers a new
// read: RefreshMin, or refreshCostFactor times the last read's duration
// if longer.
func (o *overview) refreshEvery() time.Duration {
	if o.cur == nil {
		return 0
	}
	return max(o.refreshMin, refreshCostFactor*o.cur.Took)
}

// snapshot returns the current snapshot, reading the store's status when
// the last read is older than refreshEvery. Concurrent callers share one
// read, which a caller's cancellation does not abort.
func (o *overview) snapshot(ctx context.Context) *snapshot {
	if o.admin == nil {
		return &snapshot{At: o.now()}
	}
	o.mu.Lock()
	if o.cur != nil && o.now().Sub(o.cur.At) < o.refreshEvery() {
		cur := o.cur
		o.mu.Unlock()
		return cur
	}
	if ch := o.inflight; ch != nil {
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.cur == nil {
			return &snapshot{At: o.now(), Err: ctx.Err()}
		}
		return o.cur
	}
	ch := make(chan struct{})
	o.inflight = ch
	o.mu.Unlock()

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.timeout)
	start := time.Now()
	st, err := o.admin.Status(rctx)
	took := time.Since(start)
	cancel()
	snap := &snapshot{At: o.now(), Took: took, Status: st, Err: err}

	o.mu.Lock()
	o.cur = snap
	if st != nil {
		o.backlog = appendBounded(o.backlog, backlogPoint{At: snap.At, Every: o.refreshEvery(), Outstanding: st.Outstanding, DeadLetters: st.DeadLetters})
	}
	o.inflight = nil
	close(ch)
	o.mu.Unlock()
	return snap
}

// sample records a Live source's totals.
func (o *overview) sample(l Live) {
	st := l.Stats()
	p := livePoint{At: o.now(), Published: st.Published, Dead: st.DeadLettered, Failed: st.Failed, Leases: st.Leases}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.live); n > 0 {
		prev := o.live[n-1]
		if dt := p.At.Sub(prev.At).Seconds(); dt > 0 {
			p.PublishedRate = float64(p.Published-prev.Published) / dt
			p.DeadRate = float64(p.Dead-prev.Dead) / dt
			p.haveRate = true
		}
	}
	o.live = appendBounded(o.live, p)
}

// histories returns copies of the histories within the window.
func (o *overview) histories(now time.Time) ([]backlogPoint, []livePoint) {
	o.mu.Lock()
	defer o.mu.Unlock()
	from := now.Add(-HistoryWindow)
	b := slices.Clone(o.backlog)
	b = slices.DeleteFunc(b, func(p backlogPoint) bool { return p.At.Before(from) })
	l := slices.Clone(o.live)
	l = slices.DeleteFunc(l, func(p livePoint) bool { return p.At.Before(from) || !p.haveRate })
	return b, l
}

func appendBounded[T any](s []T, v T) []T {
	if len(s) >= historyMax {
		s = append(s[:0], s[len(s)-historyMax+1:]...)
	}
	return append(s, v)
}

// runSampler samples l every liveSampleEvery until ctx ends.
func (o *overview) runSampler(ctx context.Context, l Live) {
	o.sample(l)
	t := time.NewTicker(liveSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			o.sample(l)
		}
	}
}

// partitionRanges formats partition numbers as ranges: "0-15, 32, 40-41".
func partitionRanges(ps []int) string {
	ps = slices.Clone(ps)
	slices.Sort(ps)
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(ps[i]))
		if j > i {
			fmt.Fprintf(&b, "–%d", ps[j])
		}
		i = j + 1
	}
	return b.String()
}
