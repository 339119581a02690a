package natsjs_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// syncBuffer is a bytes.Buffer safe for the relay's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRelayReportsReusedID: a new message that reuses the ID of one
// published a moment earlier is dropped by JetStream's de-duplication; the
// relay learns it from the publisher (outbox.ErrDuplicate), counts it and
// logs it, instead of deleting it silently as delivered (issue 11).
func TestRelayReportsReusedID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBroker(t)
	topic := b.stream(t, func(c *jetstream.StreamConfig) { c.Duplicates = 2 * time.Minute })
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	write := func(m outbox.Message) {
		t.Helper()
		tx, err := store.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Write(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	var logs syncBuffer
	relay, err := outbox.NewRelay(store, p, outbox.Config{
		PollInterval: 10 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer relay.Stop()
	// settled waits until n messages were published and their settlement
	// has deleted them from the outbox (the relay counts a message
	// published before it settles it), so that the ID can be written again.
	settled := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			s := relay.Stats()
			var left int
			if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if s.Published >= n && left == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("relay stats %+v, %d messages left in the outbox: fewer than %d messages settled within 30s", s, left, n)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
	}

	id := outbox.NewID()
	write(outbox.Message{ID: id, Topic: topic, Key: "order-1", Payload: []byte("first")})
	settled(1)
	// A new message, another payload, the same ID: JetStream drops it.
	write(outbox.Message{ID: id, Topic: topic, Key: "order-2", Payload: []byte("second, same ID")})
	settled(2)

	if s := relay.Stats(); s.Duplicates != 1 {
		t.Errorf("relay stats %+v; want Duplicates 1", s)
	}
	if out := logs.String(); !strings.Contains(out, "duplicate") || !strings.Contains(out, id) {
		t.Errorf("the relay did not log the duplicate with its ID %s; logs:\n%s", id, out)
	}
	got := b.read(t, topic, 1)
	if string(got[0].Payload) != "first" {
		t.Errorf("the stream holds %q; want the first message", got[0].Payload)
	}
	info, err := b.streamOf(t, topic).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the stream holds %d messages; want 1", info.State.Msgs)
	}
}
