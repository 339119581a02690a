package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broker is an in-memory broker: it records every delivery in order.
type broker struct {
	mu         sync.Mutex
	deliveries []outbox.Message
	// fail decides a message's fate: "" delivers, "before" fails without
	// delivering, "after" delivers but reports a failure (a lost ack),
	// "permanent" fails permanently.
	fail func(m *outbox.Message) string
	// gate, when set, blocks each Publish until it is closed or ctx ends.
	gate    chan struct{}
	entered chan struct{}
	calls   atomic.Int64
	maxKeys atomic.Int64 // sanity: most same-key messages seen in one call
}

func (b *broker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.calls.Add(1)
	seen := map[string]int{}
	for _, m := range msgs {
		if m.Key != "" {
			seen[m.Key]++
			if int64(seen[m.Key]) > b.maxKeys.Load() {
				b.maxKeys.Store(int64(seen[m.Key]))
			}
		}
	}
	if b.entered != nil {
		select {
		case b.entered <- struct{}{}:
		default:
		}
	}
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ctx.Done():
			return outbox.FillErrors(len(msgs), ctx.Err())
		}
	}
	errs := make([]error, len(msgs))
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range msgs {
		fate := ""
		if b.fail != nil {
			fate = b.fail(m)
		}
		switch fate {
		case "before":
			errs[i] = errors.New("broker: injected failure")
		case "after":
			b.deliveries = append(b.deliveries, *m)
			errs[i] = errors.New("broker: injected lost ack")
		case "permanent":
			errs[i] = outbox.Permanent(errors.New("broker: no route"))
		default:
			b.deliveries = append(b.deliveries, *m)
		}
	}
	return errs
}

func (b *broker) Close() error { return nil }

func (b *broker) delivered() []outbox.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]outbox.Message(nil), b.deliveries...)
}

// check verifies nothing lost and per-key order of first delivery, and
// returns the number of duplicates.
func check(t *testing.T, written map[string][]string, got []outbox.Message) int {
	t.Helper()
	return checkScope(t, outbox.OrderScopeTopic, written, got)
}

// checkScope is check under scope: under OrderScopeTopic a key's messages
// are in written order per topic; under OrderScopeKey across topics.
func checkScope(t *testing.T, scope outbox.OrderScope, written map[string][]string, got []outbox.Message) int {
	t.Helper()
	topicOf := map[string]string{}
	for _, m := range got {
		topicOf[m.ID] = m.Topic
	}
	// The written order of each queue: a key's IDs, per topic unless the
	// scope is the key.
	queue := func(m outbox.Message) string {
		if scope == outbox.OrderScopeKey {
			return m.Key
		}
		return m.Topic + "\x00" + m.Key
	}
	order := map[string][]string{}
	for key, ids := range written {
		for _, id := range ids {
			q := queue(outbox.Message{Key: key, Topic: topicOf[id]})
			order[q] = append(order[q], id)
		}
	}
	first := map[string]bool{}
	next := map[string]int{}
	dups := 0
	for _, m := range got {
		if first[m.ID] {
			dups++
			continue
		}
		first[m.ID] = true
		if m.Key == "" {
			continue
		}
		q := queue(m)
		ids := order[q]
		i := next[q]
		if i >= len(ids) || ids[i] != m.ID {
			t.Fatalf("order violation on key %q (topic %q, scope %s): delivered %s as #%d, written order %v", m.Key, m.Topic, scope, m.ID, i, ids)
		}
		next[q]++
	}
	for k, ids := range written {
		for _, id := range ids {
			if !first[id] {
				t.Fatalf("message %s of key %q lost", id, k)
			}
		}
	}
	return dups
}

// waitFor polls a condition with a deadline.
var waitFor = relaytest.WaitFor

func fastConfig() outbox.Config {
	return outbox.Config{
		Workers:        4,
		BatchSize:      64,
		PublishTimeout: time.Second,
		LeaseTTL:       3 * time.Second,
		PollInterval:   10 * time.Millisecond,
		SweepInterval:  20 * time.Millisecond,
		BackoffMin:     time.Millisecond,
		BackoffMax:     5 * time.Millisecond,
	}
}

// writeKeys writes n messages over keys keys, sequentially per key, in
// batches of up to 10, and returns the per-key write order.
func writeKeys(t *testing.T, st *memstore.Store, n, keys int) map[string][]string {
	t.Helper()
	written := map[string][]string{}
	for i := 0; i < n; {
		var batch []outbox.Message
		for j := 0; j < 10 && i < n; j++ {
			k := fmt.Sprintf("k%d", rand.IntN(keys))
			m := outbox.Message{ID: outbox.NewID(), Topic: "orders.created", Key: k, Payload: []byte(fmt.Sprint(i))}
			batch = append(batch, m)
			written[k] = append(written[k], m.ID)
			i++
		}
		if err := st.Write(context.Background(), batch...); err != nil {
			t.Fatal(err)
		}
	}
	return written
}

func startRelay(t *testing.T, st outbox.Store, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	return relaytest.Start(t, st, pub, cfg)
}

func TestRelayDrainsInKeyOrder(t *testing.T) {
	st := memstore.New(16, nil)
	written := writeKeys(t, st, 3000, 40)
	b := &broker{}
	r := startRelay(t, st, b, fastConfig())
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if dups := check(t, written, b.delivered()); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	if b.maxKeys.Load() > 1 {
		t.Fatalf("a Publish call carried %d messages of one key", b.maxKeys.Load())
	}
	if got := r.Stats().Published; got != 3000 {
		t.Fatalf("Stats.Published = %d, want 3000", got)
	}
}

func TestRelayChaosTwoRelays(t *testing.T) {
	st := memstore.New(32, nil)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	fail := func(m *outbox.Message) string {
		mu.Lock()
		defer mu.Unlock()
		switch x := rng.Float64(); {
		case x < 0.05:
			return "before"
		case x < 0.08:
			return "after"
		}
		return ""
	}
	b := &broker{fail: fail}
	cfg := fastConfig()
	cfg.MaxAttempts = 1000
	cfg.Node = "a"
	startRelay(t, st, b, cfg)
	cfg.Node = "b"
	startRelay(t, st, b, cfg)
	written := map[string][]string{}
	var wmu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			// Each writer owns its keys, so per-key write order is known.
			for i := 0; i < 1000; i++ {
				k := fmt.Sprintf("w%d-k%d", w, i%25)
				m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: k}
				wmu.Lock()
				written[k] = append(written[k], m.ID)
				wmu.Unlock()
				if err := st.Write(context.Background(), m); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, "drain", 30*time.Second, func() bool { return st.Outstanding() == 0 })
	dups := check(t, written, b.delivered())
	t.Logf("4000 messages, %d duplicates (lost acks)", dups)
	if len(st.Dead()) != 0 {
		t.Fatalf("%d dead letters", len(st.Dead()))
	}
}

// TestNotificationsWakeTheRelay: with polling effectively off, writes must
// reach the broker through notifications alone, by partition or not.
func TestNotificationsWakeTheRelay(t *testing.T) {
	for _, c := range []struct {
		name  string
		store func(*memstore.Store) outbox.Store
	}{
		{"partitions", func(st *memstore.Store) outbox.Store { return st }},
		{"any partition", func(st *memstore.Store) outbox.Store {
			return struct {
				outbox.Store
				outbox.PartitionNotifier
				outbox.MarkedFetcher
			}{st, anyPartition{st}, st}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := memstore.New(16, nil)
			b := &broker{}
			cfg := fastConfig()
			cfg.PollInterval = time.Hour
			cfg.HeartbeatInterval = 100 * time.Millisecond
			r := startRelay(t, c.store(st), b, cfg)
			waitFor(t, "leases", 10*time.Second, func() bool { return r.Stats().Leases == 16 })
			for i := 0; i < 20; i++ {
				if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: fmt.Sprint("k", i)}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the write to be published", 10*time.Second, func() bool { return len(b.delivered()) == i+1 })
			}
		})
	}
}

func TestRelayPoisonPillDeadLettersAndUnblocksKey(t *testing.T) {
	st := memstore.New(4, nil)
	poison := outbox.NewID()
	b := &broker{fail: func(m *outbox.Message) string {
		if m.ID == poison {
			return "before"
		}
		return ""
	}}
	msgs := []outbox.Message{
		{ID: poison, Topic: "t", Key: "bad"},
		{ID: outbox.NewID(), Topic: "t", Key: "bad"},
		{ID: outbox.NewID(), Topic: "t", Key: "good"},
	}
	if err := st.Write(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.MaxAttempts = 4
	r := startRelay(t, st, b, cfg)
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	dead := st.Dead()
	if len(dead) != 1 || dead[0].ID != poison || dead[0].Attempts != 4 || dead[0].LastError == "" {
		t.Fatalf("dead letters = %+v, want the poison message after 4 attempts with its error", dead)
	}
	got := b.delivered()
	if len(got) != 2 {
		t.Fatalf("delivered %d, want 2", len(got))
	}
	s := r.Stats()
	if s.DeadLettered != 1 || s.Failed != 3 || s.Published != 2 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestRelayBackoffBlocksOnlyItsKey(t *testing.T) {
	st := memstore.New(1, nil) // one partition: both keys share it
	first := outbox.NewID()
	var failing atomic.Bool
	failing.Store(true)
	b := &broker{fail: func(m *outbox.Message) string {
		if m.ID == first && failing.Load() {
			return "before"
		}
		return ""
	}}
	blocked := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "a"}
	other := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "b"}
	if err := st.Write(context.Background(), outbox.Message{ID: first, Topic: "t", Key: "a"}, blocked, other); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	startRelay(t, st, b, cfg)
	waitFor(t, "other key delivered", 10*time.Second, func() bool { _, ok := st.Record(other.ID); return !ok })
	waitFor(t, "failure recorded", 10*time.Second, func() bool { r, _ := st.Record(first); return r.Attempts == 1 })
	rec, _ := st.Record(first)
	if time.Until(rec.NextAttemptAt) < 30*time.Minute {
		t.Fatalf("next attempt in %v, want about an hour", time.Until(rec.NextAttemptAt))
	}
	for _, m := range b.delivered() {
		if m.ID == blocked.ID {
			t.Fatal("a later message of the failing key was published before the failing one")
		}
	}
}

func TestRelayPermanentErrorDeadLettersAtOnce(t *testing.T) {
	st := memstore.New(4, nil)
	b := &broker{fail: func(m *outbox.Message) string { return "permanent" }}
	if err := st.Write(context.Background(), outbox.Message{Topic: "nowhere", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	startRelay(t, st, b, fastConfig())
	waitFor(t, "dead letter", 10*time.Second, func() bool { return len(st.Dead()) == 1 })
	if d := st.Dead()[0]; d.Attempts != 1 {
		t.Fatalf("attempts = %d, want 1", d.Attempts)
	}
}

func TestRelayFindsLateCommits(t *testing.T) {
	st := memstore.New(1, nil)
	b := &broker{}
	// Hide the store's marks: the sweep alone must find the late commit.
	startRelay(t, struct{ outbox.Store }{st}, b, fastConfig())
	// The early transaction takes its sequence number first but commits
	// after a later one has been fetched and published.
	commitEarly, err := st.Begin(outbox.Message{Topic: "t", Key: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "y"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "later one published", 10*time.Second, func() bool { return len(b.delivered()) == 1 })
	commitEarly()
	waitFor(t, "late commit published", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	if n := len(b.delivered()); n != 2 {
		t.Fatalf("delivered %d, want 2", n)
	}
}

// TestRelayLateCommitKeepsKeyOrder: a transaction takes a lower Seq, then
// commits after a record with a higher Seq of another key was fetched; the
// same key's next message must not overtake it. The sweep is disabled, so
// the store's marks alone must close the gap.
func TestRelayLateCommitKeepsKeyOrder(t *testing.T) {
	st := memstore.New(1, nil)
	b := &broker{}
	cfg := fastConfig()
	cfg.SweepInterval = time.Hour
	startRelay(t, st, b, cfg)
	early := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	commitEarly, err := st.Begin(early)
	if err != nil {
		t.Fatal(err)
	}
	other := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "other"}
	if err := st.Write(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other key published", 10*time.Second, func() bool { return len(b.delivered()) == 1 })
	commitEarly()
	later := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := st.Write(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, map[string][]string{"k": {early.ID, later.ID}, "other": {other.ID}}, b.delivered())
}

func TestLeaseTakeoverFencesLateSettles(t *testing.T) {
	st := memstore.New(2, nil)
	relaytest.LeaseTakeover(t, relaytest.Harness{
		Store:       st,
		Write:       st.Write,
		Outstanding: func() int64 { return int64(st.Outstanding()) },
		Owner:       func(p int) string { owner, _ := st.Owner(p); return owner },
		DeadLetters: func() int64 { return int64(len(st.Dead())) },
	})
}

func TestStopSettlesBatchInHand(t *testing.T) {
	st := memstore.New(4, nil)
	gate := make(chan struct{})
	b := &broker{gate: gate, entered: make(chan struct{}, 1)}
	cfg := fastConfig()
	cfg.ShutdownTimeout = 10 * time.Second
	r := startRelay(t, st, b, cfg)
	if err := st.Write(context.Background(), outbox.Message{Topic: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	<-b.entered
	stopped := make(chan error)
	go func() { stopped <- r.Stop() }()
	close(gate)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st.Outstanding() != 0 {
		t.Fatal("the batch in hand was not settled on Stop")
	}
	if owner, _ := st.Owner(outbox.PartitionOf("k", 4)); owner != "" {
		t.Fatalf("lease still held by %q after Stop", owner)
	}
}

func TestStoreFailuresAreRetried(t *testing.T) {
	st := memstore.New(4, nil)
	written := writeKeys(t, st, 200, 10)
	st.FailNext("Fetch", errors.New("connection reset"))
	st.FailNext("Settle", errors.New("connection reset"))
	b := &broker{}
	startRelay(t, st, b, fastConfig())
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	check(t, written, b.delivered())
}

func TestOrderingNone(t *testing.T) {
	st := memstore.New(4, nil)
	written := writeKeys(t, st, 1000, 10)
	b := &broker{fail: func(m *outbox.Message) string {
		if rand.IntN(20) == 0 {
			return "before"
		}
		return ""
	}}
	cfg := fastConfig()
	cfg.Ordering = outbox.OrderingNone
	cfg.MaxAttempts = 100
	startRelay(t, st, b, cfg)
	waitFor(t, "drain", 10*time.Second, func() bool { return st.Outstanding() == 0 })
	checkNoneLost(t, written, b.delivered())
}

func TestNewRelayRejectsBadConfig(t *testing.T) {
	st := memstore.New(4, nil)
	cases := []struct {
		cfg  outbox.Config
		want string
	}{
		{outbox.Config{Workers: -1}, "Config.Workers must be between 1 and 256, got -1"},
		{outbox.Config{BatchSize: 20000}, "Config.BatchSize must be between 1 and 10000, got 20000"},
		{outbox.Config{Ordering: "fifo"}, `ordering must be "key" or "none", got "fifo"`},
		{outbox.Config{PublishTimeout: 10 * time.Second, LeaseTTL: 15 * time.Second}, "Config.LeaseTTL must exceed 2 × PublishTimeout"},
		{outbox.Config{MaxAttempts: -3}, "Config.MaxAttempts must be between 1 and 1000, got -3"},
		{outbox.Config{SettleInterval: -time.Millisecond}, "Config.SettleInterval must be positive and below PublishTimeout"},
		{outbox.Config{SettleInterval: time.Minute}, "Config.SettleInterval must be positive and below PublishTimeout"},
		{outbox.Config{StoreRetryMin: -time.Millisecond}, "Config.StoreRetryMin must be at least 1ms"},
	}
	for _, c := range cases {
		_, err := outbox.NewRelay(st, &broker{}, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %+v: err = %v, want it to contain %q", c.cfg, err, c.want)
		}
	}
}
