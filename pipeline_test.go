package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
)

// pipeBroker is an ordered broker (a KeyPipeliner, like Kafka's idempotent
// producer) with injected faults. At the broker it keeps the publisher's
// promise: once a message of a key fails before being written, nothing
// later of that key in the call is written. But it lies in its results:
// it reports those later messages acknowledged. The relay must not settle
// them (they would be lost), and must publish them again after the failed
// one.
type pipeBroker struct {
	perKey int
	// fault decides a message's fate on its attempt (1, 2, ...): "" writes
	// it, "before" fails without writing it, "blocked" blocks its topic
	// without writing it, "after" writes it and reports a failure (a lost
	// acknowledgement), "permanent" fails permanently without writing it.
	fault func(m *outbox.Message, attempt int) string

	mu         sync.Mutex
	deliveries []outbox.Message
	attempts   map[string]int
	maxRun     atomic.Int64 // most messages of one key seen in one call
}

func (b *pipeBroker) KeyPipeline() int { return b.perKey }
func (b *pipeBroker) Close() error     { return nil }

func (b *pipeBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := make([]error, len(msgs))
	run := map[string]int{}
	broken := map[string]bool{} // keys with a message not written in this call
	for i, m := range msgs {
		if m.Key != "" {
			run[m.Key]++
			if n := int64(run[m.Key]); n > b.maxRun.Load() {
				b.maxRun.Store(n)
			}
		}
		if broken[m.Key] {
			continue // not written, yet reported acknowledged
		}
		b.attempts[m.ID]++
		switch b.fault(m, b.attempts[m.ID]) {
		case "before":
			errs[i] = errors.New("broker: injected failure")
			broken[m.Key] = m.Key != ""
		case "blocked":
			errs[i] = outbox.Blocked(m.Topic, errors.New("broker: injected unreachable"))
			broken[m.Key] = m.Key != ""
		case "permanent":
			errs[i] = outbox.Permanent(errors.New("broker: injected refusal"))
			broken[m.Key] = m.Key != ""
		case "after":
			b.deliveries = append(b.deliveries, *m)
			errs[i] = errors.New("broker: injected lost acknowledgement")
		default:
			b.deliveries = append(b.deliveries, *m)
		}
	}
	return errs
}

func (b *pipeBroker) delivered() []outbox.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]outbox.Message(nil), b.deliveries...)
}

// settleLog records, in order, the IDs the relay settled as delivered.
type settleLog struct {
	*memstore.Store
	mu        sync.Mutex
	delivered []string
}

func (s *settleLog) Settle(ctx context.Context, node string, sts []outbox.Settlement) error {
	err := s.Store.Settle(ctx, node, sts)
	if err == nil {
		s.mu.Lock()
		for _, st := range sts {
			s.delivered = append(s.delivered, st.Delivered...)
		}
		s.mu.Unlock()
	}
	return err
}

// checkReplays verifies the stream of each key: the written order (less
// the dead-lettered messages) with duplicates only as whole redeliveries
// of a suffix (a redelivery starts at an earlier message and goes on in
// order to the end), and nothing lost.
func checkReplays(t *testing.T, written map[string][]string, dead map[string]bool, got []outbox.Message) (dups int) {
	t.Helper()
	want := map[string][]string{}
	index := map[string]int{}
	for k, ids := range written {
		for _, id := range ids {
			if !dead[id] {
				index[id] = len(want[k])
				want[k] = append(want[k], id)
			}
		}
	}
	next := map[string]int{}
	for _, m := range got {
		i, ok := index[m.ID]
		if !ok {
			t.Fatalf("delivered %s of key %q, which was dead-lettered or never written", m.ID, m.Key)
		}
		switch n := next[m.Key]; {
		case i == n:
		case i < n:
			dups++ // a redelivery from i on
		default:
			t.Fatalf("key %q: delivered #%d (%s) when #%d was due: a gap", m.Key, i, m.ID, n)
		}
		next[m.Key] = i + 1
	}
	for k, ids := range want {
		if next[k] != len(ids) {
			t.Fatalf("key %q: the stream ends at #%d of %d (a redelivery stopped short, or messages lost)", k, next[k], len(ids))
		}
	}
	return dups
}

// With a KeyPipeliner, several messages of a key are in flight in one call;
// when one of them fails (retryable, blocked, lost acknowledgement or
// permanent), the ones after it are never settled before it: the relay
// publishes them again after it, whatever the publisher said of them.
func TestRelayPipelinedKeyFailureKeepsOrder(t *testing.T) {
	st := &settleLog{Store: memstore.New(4, nil)}
	written := map[string][]string{}
	var msgs []outbox.Message
	const n, keys = 2000, 20
	for i := range n {
		k := fmt.Sprintf("k%d", i%keys)
		m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: k, Payload: []byte(strconv.Itoa(i))}
		msgs = append(msgs, m)
		written[k] = append(written[k], m.ID)
	}
	if err := st.Write(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	b := &pipeBroker{perKey: 8, attempts: map[string]int{}, fault: func(m *outbox.Message, attempt int) string {
		if attempt > 1 {
			return ""
		}
		switch i, _ := strconv.Atoi(string(m.Payload)); {
		case i == 50 || i == 1200:
			return "blocked"
		case i%7 == 3:
			return "before"
		case i%11 == 5:
			return "after"
		case i%17 == 8:
			return "permanent"
		}
		return ""
	}}
	cfg := fastConfig()
	cfg.BatchSize = 32
	r := startRelay(t, st, b, cfg)
	waitFor(t, "drain", 60*time.Second, func() bool { return st.Outstanding() == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if b.maxRun.Load() < 2 {
		t.Fatalf("at most %d message of a key per call: no pipelining", b.maxRun.Load())
	}
	dead := map[string]bool{}
	for _, d := range st.Dead() {
		dead[d.ID] = true
	}
	for i, m := range msgs {
		// (A message failed permanently only if the broker looked at it
		// on its first attempt: not behind a failure in the same call.)
		if dead[m.ID] && i%17 != 8 {
			t.Fatalf("message #%d dead-lettered without failing permanently", i)
		}
	}
	if len(dead) == 0 {
		t.Fatal("no message dead-lettered: the permanent failures were not injected")
	}
	dups := checkReplays(t, written, dead, b.delivered())
	// The settlements of each key come in its written order, once each.
	got := map[string][]string{}
	key := map[string]string{}
	for _, m := range msgs {
		key[m.ID] = m.Key
	}
	st.mu.Lock()
	for _, id := range st.delivered {
		got[key[id]] = append(got[key[id]], id)
	}
	st.mu.Unlock()
	for k, ids := range written {
		var want []string
		for _, id := range ids {
			if !dead[id] {
				want = append(want, id)
			}
		}
		if fmt.Sprint(got[k]) != fmt.Sprint(want) {
			t.Fatalf("key %q settled as delivered in the order\n%v\nwant\n%v", k, got[k], want)
		}
	}
	t.Logf("up to %d messages of a key per call; %d redelivered", b.maxRun.Load(), dups)
}

// With Config.OnPermanent = hold, a permanent failure must stop its key:
// the relay then keeps one message per key in flight, publisher or not.
func TestRelayPipelineOffWithHold(t *testing.T) {
	st := memstore.New(2, nil)
	written := writeKeys(t, st, 300, 3)
	b := &pipeBroker{perKey: 8, attempts: map[string]int{}, fault: func(*outbox.Message, int) string { return "" }}
	cfg := fastConfig()
	cfg.OnPermanent = outbox.PermanentHoldKey
	r := startRelay(t, st, b, cfg)
	waitFor(t, "drain", 20*time.Second, func() bool { return st.Outstanding() == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if got := b.maxRun.Load(); got != 1 {
		t.Fatalf("%d messages of a key in one call with OnPermanent = hold, want 1", got)
	}
	checkReplays(t, written, nil, b.delivered())
}
