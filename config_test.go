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
