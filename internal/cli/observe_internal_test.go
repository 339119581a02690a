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

// countingBacklog is a BacklogReader that counts its reads.
type countingBacklog struct{ reads atomic.Int64 }

func (c *countingBacklog) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	c.reads.Add(1)
	return &outbox.Backlog{Exact: true}, nil
}

// TestBacklogRefreshOncePerRebalance: a burst of lease changes (relays
// joining: partitions move over several rounds) refreshes the backlog
// once, not once per change (each refresh scans up to --backlog-limit
// rows); a later change refreshes again.
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
	waitReads := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for br.reads.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d backlog reads, waited for %d", br.reads.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitReads(1)        // the monitor's first refresh
	for i := range 10 { // a round every 20 ms, like eager lease rounds
		hook(outbox.Event{Kind: outbox.EventLeases, Count: i + 1})
		time.Sleep(20 * time.Millisecond)
	}
	waitReads(2)
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 64})
	waitReads(3)
	if n := br.reads.Load(); n != 3 {
		t.Fatalf("%d backlog reads for the first refresh, 10 lease changes in 200 ms and one more change; want 3", n)
	}
}
