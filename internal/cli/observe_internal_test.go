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
	waitReads(1) // the monitor's first refresh
	for i := range 20 {
		hook(outbox.Event{Kind: outbox.EventLeases, Count: i + 1})
	}
	waitReads(2)
	hook(outbox.Event{Kind: outbox.EventLeases, Count: 64})
	waitReads(3)
	if n := br.reads.Load(); n != 3 {
		t.Fatalf("%d backlog reads for the first refresh, a burst of 20 lease changes and one more change; want 3", n)
	}
}
