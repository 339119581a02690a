package outbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// spanTracer is a PublishTracer that stamps each message it sees with a
// header naming the attempt, as a tracer injects its span's context.
type spanTracer struct {
	mu       sync.Mutex
	attempts map[string][]int // message ID → the Attempts of each publish seen
	leaked   []string         // IDs whose record carried the tracer's header
	ends     map[string][]bool
}

func (s *spanTracer) StartPublish(_ context.Context, recs []*outbox.Record) ([]*outbox.Message, func([]error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msgs := make([]*outbox.Message, len(recs))
	for i, r := range recs {
		s.attempts[r.ID] = append(s.attempts[r.ID], r.Attempts)
		if _, ok := r.Headers["span"]; ok {
			s.leaked = append(s.leaked, r.ID)
		}
		m := r.Message
		m.Headers = map[string]string{"span": r.ID + "/" + string(rune('0'+r.Attempts))}
		msgs[i] = &m
	}
	return msgs, func(errs []error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, r := range recs {
			s.ends[r.ID] = append(s.ends[r.ID], errs[i] == nil)
		}
	}
}

func TestTracerWrapsEveryPublish(t *testing.T) {
	st := memstore.New(8, nil)
	var written []string
	for i := range 40 {
		m := outbox.Message{ID: outbox.NewID(), Topic: "traced", Key: string(rune('a' + i%5))}
		written = append(written, m.ID)
		if err := st.Write(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	flaky := written[7]
	var once sync.Once
	b := &broker{fail: func(m *outbox.Message) string {
		fate := ""
		if m.ID == flaky {
			once.Do(func() { fate = "before" })
		}
		return fate
	}}
	tr := &spanTracer{attempts: map[string][]int{}, ends: map[string][]bool{}}
	cfg := fastConfig()
	cfg.Tracer = tr
	r := startRelay(t, st, b, cfg)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.leaked) > 0 {
		t.Errorf("records carried the tracer's header into a later attempt: %v", tr.leaked)
	}
	for _, id := range written {
		want := []int{0}
		wantEnds := []bool{true}
		if id == flaky {
			want, wantEnds = []int{0, 1}, []bool{false, true}
		}
		if got := tr.attempts[id]; !slices.Equal(got, want) {
			t.Errorf("message %s: traced with attempts %v, want %v", id, got, want)
		}
		if got := tr.ends[id]; !slices.Equal(got, wantEnds) {
			t.Errorf("message %s: ends saw success %v, want %v", id, got, wantEnds)
		}
	}
	for _, m := range b.delivered() {
		want := m.ID + "/0"
		if m.ID == flaky {
			want = m.ID + "/1"
		}
		if m.Headers["span"] != want {
			t.Errorf("message %s reached the broker with span header %q, want %q (the tracer's copy)", m.ID, m.Headers["span"], want)
		}
	}
}

func TestRelayHealthAccessors(t *testing.T) {
	st := memstore.New(4, nil)
	r, err := outbox.NewRelay(st, &broker{}, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	if r.Running() || !r.LastStoreContact().IsZero() {
		t.Fatalf("a new relay: Running %v, LastStoreContact %v; want false, zero", r.Running(), r.LastStoreContact())
	}
	before := time.Now()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a store round trip", 10*time.Second, func() bool { return !r.LastStoreContact().IsZero() })
	if !r.Running() || r.LastStoreContact().Before(before) {
		t.Errorf("a started relay: Running %v, LastStoreContact %v; want true, after %v", r.Running(), r.LastStoreContact(), before)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.Running() {
		t.Errorf("a stopped relay says it is running")
	}
	if len(r.Blocked()) != 0 {
		t.Errorf("Blocked() = %v, want none", r.Blocked())
	}
}
