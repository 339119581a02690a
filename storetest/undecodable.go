package storetest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// Undecodable checks that a stored row the relay cannot decode (corrupt
// makes the headers of message id unreadable as a map of strings, as a
// non-Go producer or a hand edit could) is dead-lettered alone, with an
// error that says what was wrong, while the other messages of its
// partition, and the later messages of its own key, are published.
// The store must implement [outbox.AdminStore].
func Undecodable(t *testing.T, h Harness, corrupt func(ctx context.Context, id string) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dls, ok := h.Store.(outbox.AdminStore)
	if !ok {
		t.Fatalf("%T does not implement outbox.AdminStore", h.Store)
	}
	bad := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k", Headers: map[string]string{"h": "v"}}
	msgs := []outbox.Message{bad}
	for i := range 20 {
		key := "k"
		if i%2 == 1 {
			key = "other" + string(rune('a'+i))
		}
		msgs = append(msgs, outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key})
	}
	if err := h.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := corrupt(ctx, bad.ID); err != nil {
		t.Fatalf("corrupting %s: %v", bad.ID, err)
	}
	pub := &orderRecorder{}
	r, err := outbox.NewRelay(h.Store, pub, outbox.Config{
		Workers: 1, PublishTimeout: time.Second, LeaseTTL: 3 * time.Second,
		PollInterval: 10 * time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	(&suite{T: t, h: h, src: h.Store, ctx: ctx}).eventually("every decodable message published (one bad row must not stall the others)", func() (bool, error) {
		return pub.len() >= len(msgs)-1, nil
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	got := pub.ids()
	for _, m := range msgs[1:] {
		if !slicesContains(got, m.ID) {
			t.Fatalf("message %s never published", m.ID)
		}
	}
	if slicesContains(got, bad.ID) {
		t.Fatalf("the undecodable message was published")
	}
	dead, err := dls.DeadLetters(ctx, outbox.DeadLetterFilter{})
	if err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	if len(dead) != 1 || dead[0].ID != bad.ID {
		t.Fatalf("dead letters %v, want only %s", dead, bad.ID)
	}
	if !strings.Contains(dead[0].LastError, "header") || !strings.Contains(dead[0].LastError, bad.ID) {
		t.Errorf("dead letter error %q does not say that its headers could not be decoded", dead[0].LastError)
	}
	// The key's later messages follow the dead letter, in order.
	var ks []string
	for _, m := range msgs[1:] {
		if m.Key == "k" {
			ks = append(ks, m.ID)
		}
	}
	var gotK []string
	for _, id := range got {
		if slicesContains(ks, id) {
			gotK = append(gotK, id)
		}
	}
	if strings.Join(gotK, ",") != strings.Join(ks, ",") {
		t.Errorf("key k published as %v, want %v", gotK, ks)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// orderRecorder records the IDs it publishes, in order.
type orderRecorder struct {
	mu  sync.Mutex
	got []string
}

func (p *orderRecorder) Publish(_ context.Context, msgs []*outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.got = append(p.got, m.ID)
	}
	return make([]error, len(msgs))
}
func (p *orderRecorder) Close() error { return nil }
func (p *orderRecorder) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}
func (p *orderRecorder) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}
