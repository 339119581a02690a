package outbox_test

import (
	"context"
	"errors"
	"strings"
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
