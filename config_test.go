package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// Config.RetryPolicy decides when a failed message is tried again: it is
// asked with the attempts failed so far, and its delay is the one stored.
func TestRelayUsesRetryPolicy(t *testing.T) {
	st := memstore.New(1, nil)
	m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := st.Write(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []int
	cfg := fastConfig()
	cfg.MaxAttempts = 10
	cfg.RetryPolicy = func(attempts int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, attempts)
		if attempts < 3 {
			return time.Millisecond
		}
		return 7 * time.Hour
	}
	b := &broker{fail: func(*outbox.Message) string { return "before" }}
	startRelay(t, st, b, cfg)
	waitFor(t, "three failures recorded", 10*time.Second, func() bool { r, _ := st.Record(m.ID); return r.Attempts == 3 })
	rec, _ := st.Record(m.ID)
	if until := time.Until(rec.NextAttemptAt); until < 6*time.Hour || until > 7*time.Hour {
		t.Fatalf("next attempt in %v, want the policy's 7h", until)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || asked[0] != 1 || asked[1] != 2 || asked[2] != 3 {
		t.Fatalf("RetryPolicy asked with %v, want [1 2 3]", asked)
	}
}

// SettleInterval defaults to SettleIntervalDefault, or to a fifth of a
// PublishTimeout too short for it (it must stay below PublishTimeout).
func TestSettleIntervalDefault(t *testing.T) {
	if got := (outbox.Config{}).WithDefaults().SettleInterval; got != outbox.SettleIntervalDefault {
		t.Errorf("default SettleInterval %v, want %v", got, outbox.SettleIntervalDefault)
	}
	c := outbox.Config{PublishTimeout: 100 * time.Millisecond}.WithDefaults()
	if c.SettleInterval != 20*time.Millisecond {
		t.Errorf("SettleInterval %v with PublishTimeout 100ms, want 20ms", c.SettleInterval)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults with PublishTimeout 100ms: %v", err)
	}
	if got := (outbox.Config{SettleInterval: 7 * time.Millisecond}).WithDefaults().SettleInterval; got != 7*time.Millisecond {
		t.Errorf("SettleInterval set to 7ms became %v", got)
	}
}
