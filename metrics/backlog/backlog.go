// Package backlog refreshes a store's backlog on an interval for the
// metrics adapters (package metrics/prometheus exports it as gauges): how
// many messages are outstanding per topic and how old the oldest is, the
// dead letters, and the leases each live relay holds.
//
//	mon, err := backlog.New(store, backlog.Options{}) // store implements outbox.BacklogReader
//	mon.Start(ctx)
//	defer mon.Stop()
//	outboxprom.RegisterBacklog(reg, mon)
//
// Each refresh is one [outbox.BacklogReader.Backlog] call, whose cost is
// bounded by Options.Limit whatever the size of the outbox. When only the
// leases may have changed (a relay's partitions moved), RefreshLeases
// reads the leases alone from a store that implements
// [outbox.LeaseReader], without a backlog read. Between
// refreshes, readers get the last backlog measured: counts are as of
// that refresh, and ages are computed when read, from the creation times
// measured, so the age of a stuck message keeps growing even while the
// store cannot be reached.
package backlog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// Defaults and limits of [Options].
const (
	// IntervalDefault is how often the backlog is measured.
	IntervalDefault = 15 * time.Second
	// IntervalMin is the shortest interval accepted.
	IntervalMin = 10 * time.Millisecond
)

// Options configures a [Monitor]. The zero value is valid.
type Options struct {
	// Interval between refreshes (default IntervalDefault, at least
	// IntervalMin).
	Interval time.Duration
	// Limit bounds the rows one refresh reads (default
	// outbox.BacklogScanLimitDefault, at most outbox.BacklogScanLimitMax):
	// per-topic counts are exact below it.
	Limit int
	// Timeout bounds one refresh (default: Interval).
	Timeout time.Duration
	// OnRefresh, if set, is called after each successful refresh with the
	// backlog measured, from the monitor's goroutine (the Prometheus
	// adapter uses it to export every topic's counters from zero).
	OnRefresh func(*outbox.Backlog)
	// Logger receives refresh failures. Default: discard.
	Logger *slog.Logger
}

// Snapshot is what a Monitor knows now.
type Snapshot struct {
	// Backlog is the last backlog measured; nil before the first
	// successful refresh.
	Backlog *outbox.Backlog
	// At is when Backlog's counts were measured: the end of the last
	// successful Refresh (RefreshLeases leaves it).
	At time.Time
	// Took is how long that Refresh took.
	Took time.Duration
	// LeasesAt is when Backlog.Leases was read: At, or the end of a later
	// successful RefreshLeases.
	LeasesAt time.Time
	// Err is the error of the last refresh (Refresh or RefreshLeases), nil
	// if it succeeded.
	Err error
	// Failures counts the failed refreshes (of both kinds) since New.
	Failures int64
}

// Monitor refreshes a store's backlog on an interval. Its methods are safe
// for concurrent use.
type Monitor struct {
	r    outbox.BacklogReader
	opts Options

	mu   sync.Mutex
	snap Snapshot
	// leasesFrom is when the read of snap.Backlog.Leases started: of two
	// reads that overlap, the later one's leases are kept.
	leasesFrom time.Time

	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Monitor of r. The error names the option to change.
func New(r outbox.BacklogReader, opts Options) (*Monitor, error) {
	if r == nil {
		return nil, errors.New("backlog: New needs a store that implements outbox.BacklogReader")
	}
	opts.Interval = cmp.Or(opts.Interval, IntervalDefault)
	opts.Limit = cmp.Or(opts.Limit, outbox.BacklogScanLimitDefault)
	opts.Timeout = cmp.Or(opts.Timeout, opts.Interval)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case opts.Interval < IntervalMin:
		return nil, fmt.Errorf("backlog: Options.Interval must be at least %v, got %v", IntervalMin, opts.Interval)
	case opts.Limit < 1 || opts.Limit > outbox.BacklogScanLimitMax:
		return nil, fmt.Errorf("backlog: Options.Limit must be between 1 and %d, got %d", outbox.BacklogScanLimitMax, opts.Limit)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("backlog: Options.Timeout must not be negative, got %v", opts.Timeout)
	}
	return &Monitor{r: r, opts: opts}, nil
}

// Options returns the monitor's options with defaults filled in.
func (m *Monitor) Options() Options { return m.opts }

// Start refreshes at once, then every Interval, in a goroutine, until
// Stop or ctx ends. It returns at once; it fails if the monitor runs
// already.
func (m *Monitor) Start(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.done != nil {
		return errors.New("backlog: Monitor already started")
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go m.run(ctx, m.done)
	return nil
}

// Stop stops refreshing and waits for a refresh in progress to end (it is
// cancelled). The last snapshot stays readable. Stop is idempotent.
func (m *Monitor) Stop() {
	m.runMu.Lock()
	cancel, done := m.cancel, m.done
	m.runMu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (m *Monitor) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		if err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.opts.Logger.Warn("backlog: refresh failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh measures the backlog now (bounded by Options.Timeout) and
// returns the error, if any, which the snapshot keeps as well.
func (m *Monitor) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	start := time.Now()
	b, err := m.r.Backlog(ctx, m.opts.Limit)
	end := time.Now()
	m.mu.Lock()
	m.snap.Err = err
	if err != nil {
		m.snap.Failures++
	} else {
		if m.snap.Backlog != nil && m.leasesFrom.After(start) {
			// A RefreshLeases started after this read and ended before it:
			// its leases are the newer.
			c := *b
			c.Leases = m.snap.Backlog.Leases
			b = &c
		} else {
			m.leasesFrom, m.snap.LeasesAt = start, end
		}
		m.snap.Backlog, m.snap.At, m.snap.Took = b, end, end.Sub(start)
	}
	m.mu.Unlock()
	if err == nil && m.opts.OnRefresh != nil {
		m.opts.OnRefresh(b)
	}
	return err
}

// RefreshLeases updates the leases of the last backlog measured (bounded
// by Options.Timeout), for when partitions moved between relays: when the
// reader implements [outbox.LeaseReader], it reads the leases alone and
// publishes a copy of the last Backlog with its Leases replaced; the
// counts, At and Took stay those of the last Refresh, LeasesAt becomes
// now, and OnRefresh is not called (the topics did not change). Before
// the first successful refresh, or when the reader cannot read the leases
// alone, it is Refresh. It returns the error, if any, which the snapshot
// keeps as well. Safe to call concurrently with Refresh: of two reads
// that overlap, the leases of the one that started later are kept.
func (m *Monitor) RefreshLeases(ctx context.Context) error {
	lr, ok := m.r.(outbox.LeaseReader)
	if !ok || m.Snapshot().Backlog == nil {
		return m.Refresh(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	start := time.Now()
	leases, err := lr.Leases(ctx)
	end := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap.Err = err
	switch {
	case err != nil:
		m.snap.Failures++
	case !m.leasesFrom.After(start):
		b := *m.snap.Backlog // readers may hold the last one: never modified
		b.Leases = leases
		m.snap.Backlog, m.snap.LeasesAt, m.leasesFrom = &b, end, start
	}
	return err
}

// Snapshot returns what the monitor knows now. The Backlog it holds must
// not be modified.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap
}
