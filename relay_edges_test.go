package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// Stop returns the error that ended the relay: a shutdown that had to
// abandon publishes in hand says so (it used to return nil always).
func TestRelayStopReportsAbandonedWork(t *testing.T) {
	st := memstore.New(1, nil)
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	b := &broker{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg := fastConfig()
	cfg.ShutdownTimeout = 50 * time.Millisecond
	r := startRelay(t, st, b, cfg)
	<-b.entered
	err := r.Stop()
	if !errors.Is(err, outbox.ErrShutdownTimeout) {
		t.Fatalf("Stop = %v, want ErrShutdownTimeout", err)
	}
	if !strings.Contains(err.Error(), "ShutdownTimeout") {
		t.Errorf("Stop error %q does not name Config.ShutdownTimeout", err)
	}
	if err2 := r.Stop(); !errors.Is(err2, outbox.ErrShutdownTimeout) {
		t.Errorf("second Stop = %v, want the same error", err2)
	}
	close(b.gate)
}

// A relay that stops cleanly returns nil, and one whose Leave fails says so.
func TestRelayStopReportsLeaveFailure(t *testing.T) {
	st := memstore.New(1, nil)
	r := startRelay(t, st, &broker{}, fastConfig())
	waitFor(t, "leases", 5*time.Second, func() bool { return r.Stats().Leases == 1 })
	st.FailNext("Leave", errors.New("store down"))
	err := r.Stop()
	if err == nil || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("Stop = %v, want the Leave failure", err)
	}
}

// failSettle makes every Settle fail while fail is set, counting calls.
type failSettle struct {
	*memstore.Store
	fail  atomic.Bool
	calls atomic.Int64
}

func (s *failSettle) Settle(ctx context.Context, node string, st []outbox.Settlement) error {
	s.calls.Add(1)
	if s.fail.Load() {
		return errors.New("store: settle refused (injected)")
	}
	return s.Store.Settle(ctx, node, st)
}

// countingBroker delivers everything and counts messages.
type countingBroker struct {
	broker
	msgs atomic.Int64
}

func (b *countingBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.msgs.Add(int64(len(msgs)))
	return b.broker.Publish(ctx, msgs)
}

// While every settle fails, a worker stops starting publishes once its
// unwritten settlements reach their bound; a crash then re-publishes at
// most that many. (It used to publish the whole backlog, piling up
// settlements without bound.) When settles work again, everything drains
// in key order.
func TestRelayStopsPublishingWhileSettlesFail(t *testing.T) {
	st := &failSettle{Store: memstore.New(4, nil)}
	st.fail.Store(true)
	written := writeKeys(t, st.Store, 2000, 500)
	b := &countingBroker{}
	cfg := fastConfig()
	cfg.Workers, cfg.BatchSize, cfg.InFlight = 1, 16, 2
	cfg.ShutdownTimeout = 2 * time.Second
	startRelay(t, st, b, cfg)
	waitFor(t, "settle retries", 20*time.Second, func() bool { return st.calls.Load() >= 8 })
	// Unwritten settlements are bounded by 2 × BatchSize × InFlight; a
	// build started just below the bound adds at most BatchSize × InFlight.
	if n, bound := b.msgs.Load(), int64(3*cfg.BatchSize*cfg.InFlight); n > bound {
		t.Fatalf("published %d messages while every settle failed, want at most %d", n, bound)
	}
	st.fail.Store(false)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, b.delivered())
}
