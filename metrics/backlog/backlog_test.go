package backlog_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/metrics/backlog"
	"github.com/outboxrelay/outbox/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// reader is a BacklogReader whose answers the test sets.
type reader struct {
	mu     sync.Mutex
	b      *outbox.Backlog
	err    error
	limits []int
}

func (r *reader) Backlog(_ context.Context, limit int) (*outbox.Backlog, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits = append(r.limits, limit)
	return r.b, r.err
}

func (r *reader) set(b *outbox.Backlog, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b, r.err = b, err
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		opts backlog.Options
		want string
	}{
		{backlog.Options{Interval: time.Microsecond}, "Options.Interval"},
		{backlog.Options{Limit: -1}, "Options.Limit"},
		{backlog.Options{Limit: outbox.BacklogScanLimitMax + 1}, "Options.Limit"},
		{backlog.Options{Timeout: -time.Second}, "Options.Timeout"},
	} {
		if _, err := backlog.New(&reader{}, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.opts, err, c.want)
		}
	}
	if _, err := backlog.New(nil, backlog.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	m, err := backlog.New(&reader{}, backlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if o := m.Options(); o.Interval != backlog.IntervalDefault || o.Limit != outbox.BacklogScanLimitDefault || o.Timeout != backlog.IntervalDefault {
		t.Errorf("defaults: %+v", o)
	}
}

func TestRefreshKeepsTheLastBacklogAndCountsFailures(t *testing.T) {
	r := &reader{}
	var seen []*outbox.Backlog
	m, err := backlog.New(r, backlog.Options{Limit: 7, OnRefresh: func(b *outbox.Backlog) { seen = append(seen, b) }})
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Snapshot(); s.Backlog != nil || s.Failures != 0 {
		t.Fatalf("before any refresh: %+v", s)
	}
	first := &outbox.Backlog{Outstanding: 3}
	r.set(first, nil)
	if err := m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("store down")
	r.set(nil, boom)
	if err := m.Refresh(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Refresh = %v, want %v", err, boom)
	}
	s := m.Snapshot()
	if s.Backlog != first || !errors.Is(s.Err, boom) || s.Failures != 1 || s.At.IsZero() {
		t.Errorf("after a failure: %+v; want the first backlog kept, the error, 1 failure", s)
	}
	if len(seen) != 1 || seen[0] != first {
		t.Errorf("OnRefresh saw %v, want only the successful refresh", seen)
	}
	if len(r.limits) != 2 || r.limits[0] != 7 {
		t.Errorf("Backlog called with limits %v, want 7 twice", r.limits)
	}
}

func TestStartRefreshesAtOnceAndOnTheInterval(t *testing.T) {
	r := &reader{}
	r.set(&outbox.Backlog{}, nil)
	m, err := backlog.New(r, backlog.Options{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
	calls := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.limits)
	}
	relaytest.WaitFor(t, "three refreshes", 10*time.Second, func() bool { return calls() >= 3 })
	m.Stop()
	m.Stop()
	n := calls()
	if err := m.Refresh(context.Background()); err != nil { // still usable by hand
		t.Fatal(err)
	}
	if calls() != n+1 {
		t.Errorf("refreshes went on after Stop")
	}
}

// TestWithSQLite: a real store's backlog through the monitor.
func TestWithSQLite(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := st.Write(ctx, tx, outbox.Message{Topic: "a", CreatedAt: old}, outbox.Message{Topic: "a"}, outbox.Message{Topic: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	m, err := backlog.New(st, backlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	b := m.Snapshot().Backlog
	if b == nil || !b.Exact || b.Outstanding != 3 || len(b.Topics) != 2 || b.Topics[0].Outstanding != 2 || !b.OldestCreatedAt.Equal(old.Truncate(time.Nanosecond)) && b.OldestCreatedAt.Sub(old).Abs() > time.Millisecond {
		t.Errorf("backlog = %+v, want a: 2 (oldest %v), b: 1", b, old)
	}
	// A relay joins: RefreshLeases shows it, the counts kept.
	if _, err := st.Heartbeat(ctx, "node-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := m.RefreshLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.Snapshot().Backlog; len(got.Leases) != 1 || got.Leases["node-a"] != 0 || got.Outstanding != 3 {
		t.Errorf("after a heartbeat and RefreshLeases: Leases %v, Outstanding %d; want node-a: 0, 3", got.Leases, got.Outstanding)
	}
}

// leaseReader is a reader that reads the leases alone too
// (outbox.LeaseReader).
type leaseReader struct {
	reader
	leases     map[string]int
	leasesErr  error
	leaseReads int
	// wait, if set, is called by Backlog and Leases, with the method's
	// name, once they have read their answer, before they return it.
	wait func(method string)
}

func (r *leaseReader) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	b, err := r.reader.Backlog(ctx, limit)
	if r.wait != nil {
		r.wait("Backlog")
	}
	return b, err
}

func (r *leaseReader) Leases(context.Context) (map[string]int, error) {
	r.mu.Lock()
	r.leaseReads++
	leases, err := r.leases, r.leasesErr
	r.mu.Unlock()
	if r.wait != nil {
		r.wait("Leases")
	}
	return leases, err
}

func (r *leaseReader) setLeases(leases map[string]int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases, r.leasesErr = leases, err
}

// reads returns the Backlog and Leases calls so far.
func (r *leaseReader) reads() (backlogs, leases int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.limits), r.leaseReads
}

// TestRefreshLeasesReadsTheLeasesAlone: with a LeaseReader, RefreshLeases
// does not read the backlog (after the first, full, refresh): it publishes
// a copy of the last backlog with the new leases, leaves the snapshot a
// reader holds as it was, keeps At and Took, and does not call OnRefresh.
func TestRefreshLeasesReadsTheLeasesAlone(t *testing.T) {
	ctx := context.Background()
	r := &leaseReader{}
	topics := []outbox.TopicBacklog{{Topic: "a", Outstanding: 5}}
	r.set(&outbox.Backlog{Topics: topics, Outstanding: 5, Exact: true, Leases: map[string]int{"node-a": 4}}, nil)
	r.setLeases(map[string]int{"node-a": 2, "node-b": 2}, nil)
	var refreshed int
	m, err := backlog.New(r, backlog.Options{OnRefresh: func(*outbox.Backlog) { refreshed++ }})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RefreshLeases(ctx); err != nil { // nothing measured yet: a full refresh
		t.Fatal(err)
	}
	if b, l := r.reads(); b != 1 || l != 0 {
		t.Fatalf("RefreshLeases before any backlog: %d Backlog and %d Leases calls, want 1 and 0", b, l)
	}
	first := m.Snapshot()
	if err := m.RefreshLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if b, l := r.reads(); b != 1 || l != 1 {
		t.Fatalf("RefreshLeases: %d Backlog and %d Leases calls in all, want 1 and 1", b, l)
	}
	s := m.Snapshot()
	if got := s.Backlog.Leases; len(got) != 2 || got["node-a"] != 2 || got["node-b"] != 2 {
		t.Errorf("Leases after RefreshLeases = %v, want node-a: 2, node-b: 2", got)
	}
	if s.Backlog == first.Backlog || first.Backlog.Leases["node-a"] != 4 || len(first.Backlog.Leases) != 1 {
		t.Errorf("RefreshLeases modified the backlog a reader held: %v", first.Backlog.Leases)
	}
	if s.Backlog.Outstanding != 5 || !s.Backlog.Exact || len(s.Backlog.Topics) != 1 || s.Backlog.Topics[0] != topics[0] {
		t.Errorf("counts after RefreshLeases = %+v, want those of the last Refresh", s.Backlog)
	}
	if !s.At.Equal(first.At) || s.Took != first.Took || s.LeasesAt.Before(first.LeasesAt) || !first.LeasesAt.Equal(first.At) {
		t.Errorf("times: At %v → %v, Took %v → %v, LeasesAt %v → %v; want At and Took kept, LeasesAt = At, then later",
			first.At, s.At, first.Took, s.Took, first.LeasesAt, s.LeasesAt)
	}
	if refreshed != 1 {
		t.Errorf("OnRefresh called %d times, want once (by the first, full, refresh)", refreshed)
	}

	boom := errors.New("store down")
	r.setLeases(nil, boom)
	if err := m.RefreshLeases(ctx); !errors.Is(err, boom) {
		t.Fatalf("RefreshLeases = %v, want %v", err, boom)
	}
	if f := m.Snapshot(); f.Backlog != s.Backlog || !errors.Is(f.Err, boom) || f.Failures != 1 {
		t.Errorf("after a failed RefreshLeases: %+v; want the backlog kept, the error, 1 failure", f)
	}
}

// TestRefreshLeasesWithoutLeaseReaderRefreshes: a store that cannot read
// the leases alone gets a full refresh.
func TestRefreshLeasesWithoutLeaseReaderRefreshes(t *testing.T) {
	r := &reader{}
	r.set(&outbox.Backlog{Leases: map[string]int{"node-a": 1}}, nil)
	var refreshed int
	m, err := backlog.New(r, backlog.Options{OnRefresh: func(*outbox.Backlog) { refreshed++ }})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := m.RefreshLeases(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.limits) != 2 || refreshed != 2 {
		t.Errorf("two RefreshLeases: %d Backlog calls, %d OnRefresh; want 2 and 2", len(r.limits), refreshed)
	}
}

// TestOverlappingRefreshesKeepTheNewerLeases: of a Refresh and a
// RefreshLeases that overlap, the leases of the read that started later
// are kept, whichever ends last.
func TestOverlappingRefreshesKeepTheNewerLeases(t *testing.T) {
	ctx := context.Background()
	for _, slow := range []string{"Backlog", "Leases"} {
		t.Run("slow "+slow, func(t *testing.T) {
			r := &leaseReader{}
			r.set(&outbox.Backlog{Outstanding: 1, Leases: map[string]int{"node-a": 1}}, nil)
			m, err := backlog.New(r, backlog.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			// The slow read starts first, reads the old leases, and waits
			// in its store call until the other read, of the new ones,
			// has ended.
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			r.wait = func(method string) {
				if method == slow {
					once.Do(func() { close(entered); <-release })
				}
			}
			r.set(&outbox.Backlog{Outstanding: 2, Leases: map[string]int{"old": 1}}, nil)
			r.setLeases(map[string]int{"old": 1}, nil)
			first, second := m.Refresh, m.RefreshLeases
			if slow == "Leases" {
				first, second = m.RefreshLeases, m.Refresh
			}
			done := make(chan error, 1)
			go func() { done <- first(ctx) }()
			<-entered
			r.set(&outbox.Backlog{Outstanding: 2, Leases: map[string]int{"new": 1}}, nil)
			r.setLeases(map[string]int{"new": 1}, nil)
			if err := second(ctx); err != nil {
				t.Fatal(err)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			s := m.Snapshot()
			if s.Backlog.Outstanding != 2 || len(s.Backlog.Leases) != 1 || s.Backlog.Leases["new"] != 1 {
				t.Errorf("snapshot %+v, want Outstanding 2 and the leases of the later read (new: 1)", s.Backlog)
			}
		})
	}
}
