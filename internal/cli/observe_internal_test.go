package cli

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox"
)

// countingBacklog is a BacklogReader and LeaseReader that counts its
// reads of each kind.
type countingBacklog struct{ reads, leaseReads atomic.Int64 }

func (c *countingBacklog) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	c.reads.Add(1)
	return &outbox.Backlog{Exact: true, Leases: map[string]int{}}, nil
}

func (c *countingBacklog) Leases(ctx context.Context) (map[string]int, error) {
	c.leaseReads.Add(1)
	return map[string]int{"node-a": int(c.leaseReads.Load())}, nil
}

// TestBacklogRefreshOncePerRebalance: a burst of lease changes (relays
// joining: partitions move over several rounds) refreshes the lease
// gauges once, not once per change, and from the leases alone: no backlog
// read (each scans up to --backlog-limit rows, in every relay); a later
// change refreshes them again.
func TestBacklogRefreshOncePerRebalance(t *testing.T) {
	// The rounds of a rebalance come 20 ms apart here: however slow the
	// machine, they are closer than the quiet spell, and the refresh comes
	// at the latest 2 s after the first.
	quiet, most := leaseRefreshQuiet, leaseRefreshMax
	leaseRefreshQuiet, leaseRefreshMax = time.Hour, 2*time.Second
	defer func() { leaseRefreshQuiet, leaseRefreshMax = quiet, most }()
	a := &app{log: slog.New(slog.DiscardHandler)}
	br := &countingBacklog{}
	o, err := a.newObservability(prometheus.NewRegistry(), br, &observeFlags{backlogInterval: time.Hour, backlogLimit: 100})
	if err != nil {
		t.Fatal(err)
	}
	hook := o.hook()
	if err := o.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer o.stop()
	// waitReads waits for n reads of either kind, then checks how many
	// were backlog reads and how many lease reads.
	waitReads := func(backlogs, leases int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for br.reads.Load()+br.leaseReads.Load() < backlogs+leases {
			if time.Now().After(deadline) {
				t.Fatalf("%d backlog and %d lease reads, waited for %d and %d", br.reads.Load(), br.leaseReads.Load(), backlogs, leases)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if b, l := br.reads.Load(), br.leaseReads.Load(); b != backlogs || l != leases {
			t.Fatalf("%d backlog and %d lease reads; want %d and %d", b, l, backlogs, leases)
		}
	}
	waitReads(1, 0)     // the monitor's first refresh
	for i := range 10 { // a round every 20 ms, like eager lease rounds
		hook(outbox.Event{Kind: outbox.EventLeases, Count: i + 1})
		time.Sleep(20 * time.Millisecond)
	}
	waitReads(1, 1) // 10 lease changes in 200 ms: one lease read
	// which the gauges show (the snapshot follows the read).
	for deadline := time.Now().Add(time.Minute); o.monitor.Snapshot().Backlog.Leases["node-a"] != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease gauges after the rebalance: %v, want node-a: 1 (the lease read's)", o.monitor.Snapshot().Backlog.Leases)
		}
	}
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 64})
	waitReads(1, 2)
}
