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
}
