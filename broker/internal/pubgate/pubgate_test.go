package pubgate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

func newGate() *Gate {
	return New(Config{Name: "test", Timeout: time.Hour, TimeoutField: "PublishTimeout", Awaited: "confirm"})
}

func TestDoGivesDefaultDeadline(t *testing.T) {
	g := newGate()
	var ran bool
	errs := g.Do(context.Background(), 2, func(ctx context.Context, errs []error) {
		ran = true
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the call's context has no deadline")
		}
		if len(errs) != 2 {
			t.Errorf("publish got %d results to fill, want 2", len(errs))
		}
		errs[1] = errors.New("boom")
	})
	if !ran || len(errs) != 2 || errs[0] != nil || errs[1] == nil {
		t.Fatalf("ran %v, results %v", ran, errs)
	}
}

func TestDoKeepsCallerDeadline(t *testing.T) {
	g := newGate()
	want := time.Now().Add(time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	g.Do(ctx, 1, func(ctx context.Context, _ []error) {
		if d, _ := ctx.Deadline(); !d.Equal(want) {
			t.Errorf("deadline %v, want the caller's %v", d, want)
		}
	})
}

func TestDefaultDeadlineCause(t *testing.T) {
	g := New(Config{Name: "test", Timeout: time.Nanosecond, TimeoutField: "AckTimeout", Awaited: "acknowledgement"})
	g.Do(context.Background(), 1, func(ctx context.Context, _ []error) {
		<-ctx.Done()
		cause := context.Cause(ctx)
		if !errors.Is(cause, context.DeadlineExceeded) || cause.Error() != "test: no acknowledgement within AckTimeout (1ns): context deadline exceeded" {
			t.Errorf("cause %q", cause)
		}
	})
}

func TestDoRefuses(t *testing.T) {
	g := newGate()
	never := func(context.Context, []error) { t.Error("publish ran") }
	if errs := g.Do(context.Background(), 0, never); errs == nil || len(errs) != 0 {
		t.Errorf("no messages: %#v, want an empty slice", errs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := g.Do(ctx, 2, never)
	if len(errs) != 2 || !errors.Is(errs[1], context.Canceled) || errs[1].Error() != "test: publish: not sent: context canceled" {
		t.Errorf("ended context: %v", errs)
	}
	if !g.Close() {
		t.Error("first Close reported false")
	}
	if g.Close() {
		t.Error("second Close reported true")
	}
	errs = g.Do(context.Background(), 3, never)
	if len(errs) != 3 || !errors.Is(errs[2], outbox.ErrClosed) {
		t.Errorf("closed: %v", errs)
	}
	if err := g.Run(func() error { t.Error("call ran"); return nil }); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Run when closed: %v", err)
	}
}

func TestCloseWaitsForCalls(t *testing.T) {
	g := newGate()
	inCall, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Do(context.Background(), 1, func(context.Context, []error) {
			close(inCall)
			<-release
		})
	}()
	<-inCall
	closed := make(chan bool)
	go func() { closed <- g.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a call was in progress")
	case <-done:
		t.Fatal("the call ended before it was released")
	default:
	}
	close(release)
	if !<-closed {
		t.Error("Close reported false")
	}
	<-done
}
