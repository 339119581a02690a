package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// Harness connects the conformance suite to one broker and its publisher.
// Topic, MissingTopic, Read, Restart and Stop are called from the test's
// goroutine only; they report problems with t.Fatal.
//
// The suite checks that the publisher classifies its failures as the relay
// needs (see outbox.Permanent and outbox.Blocked): a message that can never
// be published (too large) is permanent; a destination that is not usable
// (no stream, topic or binding for it, the broker stopped) blocks the
// message's topic; a message the broker reports as a duplicate wraps
// outbox.ErrDuplicate.
type Harness struct {
	// Publisher is the publisher under test. The harness owns it: the
	// function that built the harness closes it with t.Cleanup. The suite may
	// call Close itself first, so Close must tolerate a second call; after
	// Close, Publish must fail every message with an error wrapping
	// outbox.ErrClosed.
	Publisher outbox.Publisher

	// Topic returns a new topic routed to a destination that exists and can
	// be read back with Read (creating the stream, queue or topic as needed).
	// Each call returns a topic no other test uses.
	Topic func(t *testing.T) string

	// MissingTopic returns a topic with no destination (no stream covers
	// it, no such topic, no queue bound for it): publishing to it must fail
	// with an error for which outbox.IsBlocked reports that topic, which is
	// not permanent, and which names the topic. It returns "" (or is nil) if
	// the broker cannot detect that.
	MissingTopic func(t *testing.T) string

	// Read returns the next n messages delivered on topic, in the order the
	// broker delivers them, with the outbox ID, key, headers, payload and (if
	// carried) creation time recovered from the broker's metadata. Successive
	// calls for one topic continue where the previous one stopped. Read fails
	// the test if n messages have not arrived within a deadline of the
	// harness's choosing (a few seconds to a minute).
	Read func(t *testing.T, topic string, n int) []Received

	// Restart, if not nil, stops the broker and starts it again at the same
	// address, with its stored data, and returns once it accepts
	// connections. The suite calls it while a batch is being published.
	Restart func(t *testing.T)

	// Stop, if not nil, stops the broker and returns a function that starts
	// it again at the same address, with its stored data, and returns once it
	// accepts connections. While it is stopped, every publish must fail with
	// an error blocking the message's topic (the relay spends no attempt on
	// it); afterwards the publisher must recover by itself.
	Stop func(t *testing.T) (start func(t *testing.T))

	// MaxPayload is the largest payload the broker accepts, in bytes (0 if
	// unknown). The suite publishes a payload of MaxPayload+1 bytes and
	// expects a permanent error for that message only.
	MaxPayload int

	// Dedup reports whether the broker drops a message whose ID it has
	// already stored (NATS JetStream with Nats-Msg-Id). If true the suite
	// expects the second publish of an ID to fail with an error wrapping
	// outbox.ErrDuplicate (which the relay counts as delivered) and consumers
	// to see the ID exactly once; otherwise a second publish may succeed or
	// report a duplicate, and consumers see the ID at least once.
	Dedup bool
}

// Received is a message as a consumer sees it.
type Received struct {
	ID    string
	Key   string
	Topic string
	// Payload is the message body; nil and empty are equivalent.
	Payload []byte
	// Headers holds the headers delivered: at least the message's own
	// Headers, possibly also the publisher's and the broker's (Outbox-Key,
	// Nats-Msg-Id, ...).
	Headers map[string]string
	// CreatedAt is Message.CreatedAt if the publisher carries it (the
	// Outbox-Created-At header), else zero. The suite accepts a value
	// truncated to the millisecond.
	CreatedAt time.Time
}

// publishTimeout bounds every Publish call the suite makes; a publisher that
// has not returned by then fails the test.
const publishTimeout = 90 * time.Second

// Run runs the publisher conformance suite. newHarness is called once per
// subtest, with the subtest's t, and must give that subtest a working
// publisher; it may be called from several subtests at once, since all
// subtests but the restart test run in parallel. Use it from a test of the
// publisher's package:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, func(t *testing.T) brokertest.Harness { ... })
//	}
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	setup := func(t *testing.T) Harness {
		t.Helper()
		h := newHarness(t)
		if h.Publisher == nil || h.Topic == nil || h.Read == nil {
			t.Fatalf("brokertest: the Harness needs Publisher, Topic and Read (got Publisher=%v, Topic set=%v, Read set=%v)",
				h.Publisher, h.Topic != nil, h.Read != nil)
		}
		return h
	}
	// The restart test runs first, alone, as restarting a shared broker
	// would disturb the other tests; the parallel tests start once Run's body
	// has returned.
	t.Run("RestartDuringBatch", func(t *testing.T) { testRestart(t, setup(t)) })
	t.Run("PublishWhileStopped", func(t *testing.T) { testStopped(t, setup(t)) })
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"ResultsPerMessage", testResultsPerMessage},
		{"RoundTrip", testRoundTrip},
		{"KeyAndHeaderText", testText},
		{"OrderPerKeyAcrossBatches", testOrder},
		{"MissingTopic", testMissingTopic},
		{"OversizedPayload", testOversized},
		{"CancelledContext", testCancelledContext},
		{"CancelDuringBatch", testCancelDuringBatch},
		{"ConcurrentPublish", testConcurrent},
		{"LargeBatch", testLargeBatch},
		{"DuplicateID", testDuplicateID},
		{"Close", testClose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, setup(t))
		})
	}
}

// newMessage returns a valid message with a fresh ID.
func newMessage(topic, key string, payload []byte) *outbox.Message {
	return &outbox.Message{
		ID:        outbox.NewID(),
		Topic:     topic,
		Key:       key,
		Payload:   payload,
		Headers:   map[string]string{"Test-Header": "value of [" + key + "]"},
		CreatedAt: time.Now(),
	}
}

// newBatch returns n messages on topic; key(i) gives the key of the i-th.
func newBatch(topic string, n int, key func(i int) string) []*outbox.Message {
	msgs := make([]*outbox.Message, n)
	for i := range msgs {
		msgs[i] = newMessage(topic, key(i), fmt.Appendf(nil, "payload %d", i))
	}
	return msgs
}

// publish calls Publish with a bounded context and checks that there is one
// result per message.
func publish(t *testing.T, p outbox.Publisher, msgs []*outbox.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	return checkLen(t, msgs, p.Publish(ctx, msgs))
}

func checkLen(t testing.TB, msgs []*outbox.Message, errs []error) []error {
	t.Helper()
	if len(errs) != len(msgs) {
		t.Fatalf("Publish of %d messages returned %d results; want one per message", len(msgs), len(errs))
	}
	return errs
}

// requireAllOK fails the test if any result is an error.
func requireAllOK(t testing.TB, msgs []*outbox.Message, errs []error) {
	t.Helper()
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("message %d (%s): %v", i, msgs[i].ID, err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d messages failed; first: %s", len(failed), len(msgs), strings.Join(failed[:min(len(failed), 5)], "; "))
	}
}

// readIDs reads from topic until every ID of want has been delivered, and
// returns what was read. Deliveries of IDs in allowed (published, but not
// acknowledged) are accepted; any other delivery fails the test. It never
// asks Read for more messages than are known to be stored, so a lost
// message makes Read fail at its deadline.
func readIDs(t *testing.T, h Harness, topic string, want []string, allowed map[string]bool) []Received {
	t.Helper()
	remaining := make(map[string]bool, len(want))
	for _, id := range want {
		remaining[id] = true
	}
	known := maps.Clone(remaining)
	var all []Received
	for len(remaining) > 0 {
		got := h.Read(t, topic, len(remaining))
		if len(got) == 0 {
			t.Fatalf("Read(%q, %d) returned no messages", topic, len(remaining))
		}
		for _, r := range got {
			if !known[r.ID] && !allowed[r.ID] {
				t.Fatalf("read a message with ID %q that was never published on %q", r.ID, topic)
			}
			delete(remaining, r.ID)
		}
		all = append(all, got...)
	}
	return all
}

// requireSame fails the test unless r carries m's fields.
func requireSame(t *testing.T, m *outbox.Message, r Received) {
	t.Helper()
	if r.ID != m.ID {
		t.Fatalf("received ID %q, want %q", r.ID, m.ID)
	}
	if r.Topic != m.Topic {
		t.Errorf("message %s: received topic %q, want %q", m.ID, r.Topic, m.Topic)
	}
	if r.Key != m.Key {
		t.Errorf("message %s: received key %q, want %q", m.ID, r.Key, m.Key)
	}
	if !bytes.Equal(r.Payload, m.Payload) {
		t.Errorf("message %s: received payload %q (%d bytes), want %q (%d bytes)", m.ID, trunc(r.Payload), len(r.Payload), trunc(m.Payload), len(m.Payload))
	}
	for k, v := range m.Headers {
		got, ok := r.Headers[k]
		if !ok {
			t.Errorf("message %s: header %q missing; received headers %v", m.ID, k, r.Headers)
		} else if got != v {
			t.Errorf("message %s: header %q = %q, want %q", m.ID, k, got, v)
		}
	}
	if !r.CreatedAt.IsZero() {
		if d := m.CreatedAt.Sub(r.CreatedAt); d < 0 || d >= time.Millisecond {
			t.Errorf("message %s: received CreatedAt %v, want %v (or that truncated to the millisecond)", m.ID, r.CreatedAt, m.CreatedAt)
		}
	}
}

func trunc(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

// testResultsPerMessage: one result per message, including for an empty
// batch, and nil for every acknowledged message.
func testResultsPerMessage(t *testing.T, h Harness) {
	topic := h.Topic(t)
	if errs := publish(t, h.Publisher, nil); len(errs) != 0 {
		t.Fatalf("Publish of no messages returned %d results", len(errs))
	}
	for _, n := range []int{1, 7, 100} {
		msgs := newBatch(topic, n, func(i int) string { return fmt.Sprintf("key-%d", i) })
		requireAllOK(t, msgs, publish(t, h.Publisher, msgs))
		// Delivery order across keys is the broker's business: match by ID.
		byID := map[string]*outbox.Message{}
		for _, m := range msgs {
			byID[m.ID] = m
		}
		for _, r := range h.Read(t, topic, n) {
			m, ok := byID[r.ID]
			if !ok {
				t.Fatalf("received ID %q, which was not published or was received twice", r.ID)
			}
			delete(byID, r.ID)
			requireSame(t, m, r)
		}
	}
}

// testRoundTrip: ID, key, headers and payload (binary, empty) survive the
// trip through the broker.
func testRoundTrip(t *testing.T, h Harness) {
	topic := h.Topic(t)
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	manyHeaders := map[string]string{}
	for i := range 20 {
		manyHeaders[fmt.Sprintf("X-Header-%02d", i)] = fmt.Sprintf("value %d with spaces; and=signs", i)
	}
	msgs := []*outbox.Message{
		{Key: "order-1", Payload: []byte(`{"id":1}`), Headers: map[string]string{"Content-Type": "application/json", "lower-case": "v", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		{Key: "", Payload: binary},
		{Key: "ключ ✓ with spaces", Payload: []byte{}},
		{Key: "nil-payload", Payload: nil},
		{Key: "many-headers", Payload: []byte("h"), Headers: manyHeaders},
		{Key: "empty-header-value", Payload: []byte("e"), Headers: map[string]string{"Empty": ""}},
		{Key: strings.Repeat("k", outbox.MaxKeyLen), Payload: bytes.Repeat([]byte{0, 0xff}, 32<<10)},
	}
	base := time.Now()
	for i, m := range msgs {
		m.ID = outbox.NewID()
		m.Topic = topic
		m.CreatedAt = base.Add(time.Duration(i) * time.Nanosecond)
		if err := m.Validate(0); err != nil {
			t.Fatalf("test message %d is invalid: %v", i, err)
		}
	}
	requireAllOK(t, msgs, publish(t, h.Publisher, msgs))
	got := h.Read(t, topic, len(msgs))
	byID := map[string]*outbox.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	seen := map[string]bool{}
	for _, r := range got {
		m, ok := byID[r.ID]
		if !ok {
			t.Fatalf("received ID %q, which was not published", r.ID)
		}
		if seen[r.ID] {
			t.Fatalf("received ID %q twice", r.ID)
		}
		seen[r.ID] = true
		requireSame(t, m, r)
	}
}

// testOrder: consecutive batches with distinct keys within each batch are
// delivered in publish order per key.
func testOrder(t *testing.T, h Harness) {
	const keys, batches = 20, 10
	topic := h.Topic(t)
	c := NewChecker()
	for range batches {
		msgs := newBatch(topic, keys, func(i int) string { return fmt.Sprintf("key-%d", i) })
		for _, m := range msgs {
			c.Written(m.Key, m.ID)
		}
		requireAllOK(t, msgs, publish(t, h.Publisher, msgs))
	}
	for _, r := range h.Read(t, topic, keys*batches) {
		c.Delivered(r)
	}
	requireReport(t, c.Verify(), false)
}

// requireReport fails the test if the report shows a lost, unknown or
// misrouted message, an order violation, or (unless dupsOK) a duplicate.
func requireReport(t testing.TB, rep Report, dupsOK bool) {
	t.Helper()
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if !dupsOK && len(rep.Duplicates) > 0 {
		t.Fatalf("%d duplicate deliveries (for example %v) where none was expected", len(rep.Duplicates), rep.Duplicates[:min(5, len(rep.Duplicates))])
	}
}

// testMissingTopic: a message to a topic without destination blocks that
// topic, with an error naming it, and fails only that message.
func testMissingTopic(t *testing.T, h Harness) {
	missing := ""
	if h.MissingTopic != nil {
		missing = h.MissingTopic(t)
	}
	if missing == "" {
		t.Skip("the harness has no MissingTopic: this broker cannot detect a topic without destination")
	}
	topic := h.Topic(t)
	msgs := []*outbox.Message{
		newMessage(topic, "a", []byte("before")),
		newMessage(missing, "b", []byte("lost")),
		newMessage(topic, "c", []byte("after")),
	}
	errs := publish(t, h.Publisher, msgs)
	if errs[1] == nil {
		t.Fatalf("publishing to missing topic %q succeeded; want an error blocking the topic", missing)
	}
	requireBlocked(t, "publishing to missing topic", missing, errs[1])
	if !strings.Contains(errs[1].Error(), missing) {
		t.Errorf("publishing to missing topic %q: error %q does not name the topic", missing, errs[1])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("the other messages of the batch failed: %v, %v; want nil (results must be one per message, in order)", errs[0], errs[2])
	}
	got := h.Read(t, topic, 2)
	readBack := map[string]bool{got[0].ID: true, got[1].ID: true}
	if !readBack[msgs[0].ID] || !readBack[msgs[2].ID] {
		t.Fatalf("read IDs %v; want %s and %s", slicesCollect(readBack), msgs[0].ID, msgs[2].ID)
	}
	// A second attempt fails the same way (nothing was created on the fly).
	errs = publish(t, h.Publisher, msgs[1:2])
	requireBlocked(t, "second publish to missing topic", missing, errs[0])
}

// requireBlocked fails the test unless err blocks destination topic and is
// not permanent.
func requireBlocked(t testing.TB, what, topic string, err error) {
	t.Helper()
	dest, ok := outbox.IsBlocked(err)
	switch {
	case !ok:
		t.Errorf("%s %q: error %v does not block the destination (wrap it with outbox.Blocked(topic, err))", what, topic, err)
	case dest != topic:
		t.Errorf("%s %q: error %v blocks destination %q; want the message's topic", what, topic, err, dest)
	case outbox.IsPermanent(err):
		t.Errorf("%s %q: error %v is also permanent: the destination, not the message, is at fault", what, topic, err)
	}
}

func slicesCollect(m map[string]bool) []string {
	var s []string
	for k := range maps.Keys(m) {
		s = append(s, k)
	}
	return s
}

// testOversized: a payload over the broker's limit fails permanently, for
// that message only.
func testOversized(t *testing.T, h Harness) {
	if h.MaxPayload <= 0 {
		t.Skip("the harness does not know the broker's MaxPayload")
	}
	topic := h.Topic(t)
	big := newMessage(topic, "big", bytes.Repeat([]byte("x"), h.MaxPayload+1))
	msgs := []*outbox.Message{
		newMessage(topic, "a", []byte("small before")),
		big,
		newMessage(topic, "c", []byte("small after")),
	}
	errs := publish(t, h.Publisher, msgs)
	if errs[1] == nil {
		t.Fatalf("a payload of %d bytes (MaxPayload+1) was acknowledged; want a permanent error", len(big.Payload))
	}
	if !outbox.IsPermanent(errs[1]) {
		t.Errorf("oversized payload: error %q is not permanent (wrap it with outbox.Permanent)", errs[1])
	}
	if dest, blocked := outbox.IsBlocked(errs[1]); blocked {
		t.Errorf("oversized payload: error %q blocks destination %q: the message, not the destination, is at fault", errs[1], dest)
	}
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("the other messages of the batch failed: %v, %v; want nil", errs[0], errs[2])
	}
	// Publish a marker, then read three messages: the two small ones and the
	// marker. The oversized one must not be among them.
	marker := newMessage(topic, "a", []byte("marker"))
	requireAllOK(t, []*outbox.Message{marker}, publish(t, h.Publisher, []*outbox.Message{marker}))
	for _, r := range h.Read(t, topic, 3) {
		if r.ID == big.ID {
			t.Fatalf("the oversized message was delivered although its publish failed")
		}
	}
}

// testCancelledContext: with a context already cancelled, every result is a
// (retryable) error and Publish returns promptly.
func testCancelledContext(t *testing.T, h Harness) {
	topic := h.Topic(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := newBatch(topic, 50, func(i int) string { return fmt.Sprintf("k%d", i) })
	errs := publishWithin(t, h.Publisher, ctx, msgs, 10*time.Second)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("message %d: Publish with a cancelled context returned nil; want an error", i)
		}
		if outbox.IsPermanent(err) {
			t.Fatalf("message %d: Publish with a cancelled context returned a permanent error %q; a cancellation must be retryable", i, err)
		}
	}
	// The publisher still works.
	ok := newBatch(topic, 3, func(i int) string { return fmt.Sprintf("k%d", i) })
	requireAllOK(t, ok, publish(t, h.Publisher, ok))
}

// publishWithin runs Publish and fails the test if it has not returned
// within limit.
func publishWithin(t *testing.T, p outbox.Publisher, ctx context.Context, msgs []*outbox.Message, limit time.Duration) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- p.Publish(ctx, msgs) }()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case errs := <-done:
		return checkLen(t, msgs, errs)
	case <-timer.C:
		t.Fatalf("Publish of %d messages did not return within %v of its context ending", len(msgs), limit)
		return nil
	}
}

// testCancelDuringBatch: a context ending while a large batch is in flight
// makes Publish return promptly, with retryable errors; every message it
// acknowledged is stored.
func testCancelDuringBatch(t *testing.T, h Harness) {
	const n = 3000
	topic := h.Topic(t)
	// Time a whole batch, then cancel the next one after half that time so
	// that the cancellation most likely lands in the middle of it. (The
	// timing only decides what is covered, not whether the test passes.)
	warm := newBatch(topic, n, func(i int) string { return fmt.Sprintf("k%d", i) })
	start := time.Now()
	requireAllOK(t, warm, publish(t, h.Publisher, warm))
	half := time.Since(start) / 2
	readIDs(t, h, topic, ids(warm), nil)

	msgs := newBatch(topic, n, func(i int) string { return fmt.Sprintf("k%d", i) })
	ctx, cancel := context.WithTimeout(context.Background(), half)
	defer cancel()
	errs := publishWithin(t, h.Publisher, ctx, msgs, half+10*time.Second)
	acked, failed := split(msgs, errs)
	t.Logf("batch cancelled after %v: %d acknowledged, %d failed", half, len(acked), len(failed))
	for i, err := range errs {
		if err != nil && outbox.IsPermanent(err) {
			t.Fatalf("message %d: cancellation gave a permanent error %q; it must be retryable", i, err)
		}
	}
	// Everything acknowledged is readable; then a new batch goes through.
	after := newBatch(topic, 10, func(i int) string { return fmt.Sprintf("k%d", i) })
	requireAllOK(t, after, publish(t, h.Publisher, after))
	readIDs(t, h, topic, append(acked, ids(after)...), failed)
}

// split returns the IDs of the acknowledged and (as a set) failed messages.
func split(msgs []*outbox.Message, errs []error) (acked []string, failed map[string]bool) {
	failed = map[string]bool{}
	for i, err := range errs {
		if err == nil {
			acked = append(acked, msgs[i].ID)
		} else {
			failed[msgs[i].ID] = true
		}
	}
	return acked, failed
}

func ids(msgs []*outbox.Message) []string {
	s := make([]string, len(msgs))
	for i, m := range msgs {
		s[i] = m.ID
	}
	return s
}

// testConcurrent: 8 goroutines publish batches concurrently; everything is
// acknowledged and delivered once, in order per key.
func testConcurrent(t *testing.T, h Harness) {
	const goroutines, batches, size = 8, 5, 25
	topic := h.Topic(t)
	c := NewChecker()
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
			defer cancel()
			for range batches {
				msgs := newBatch(topic, size, func(i int) string { return fmt.Sprintf("g%d-k%d", g, i) })
				for _, m := range msgs {
					c.Written(m.Key, m.ID)
				}
				errs := h.Publisher.Publish(ctx, msgs)
				if len(errs) != len(msgs) {
					errc <- fmt.Errorf("goroutine %d: %d results for %d messages", g, len(errs), len(msgs))
					return
				}
				for i, err := range errs {
					if err != nil {
						errc <- fmt.Errorf("goroutine %d: message %d: %w", g, i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, r := range h.Read(t, topic, goroutines*batches*size) {
		c.Delivered(r)
	}
	requireReport(t, c.Verify(), false)
}

// testLargeBatch: one call with 5,000 messages completes, and every message
// is delivered exactly once.
func testLargeBatch(t *testing.T, h Harness) {
	const n = 5000
	topic := h.Topic(t)
	msgs := newBatch(topic, n, func(i int) string {
		if i%2 == 0 {
			return "" // no key: no order
		}
		return fmt.Sprintf("key-%d", i)
	})
	c := NewChecker()
	for _, m := range msgs {
		c.Written(m.Key, m.ID)
	}
	requireAllOK(t, msgs, publish(t, h.Publisher, msgs))
	for _, r := range h.Read(t, topic, n) {
		c.Delivered(r)
	}
	requireReport(t, c.Verify(), false)
}

// testDuplicateID: publishing the same ID twice succeeds the first time;
// the second time it reports a duplicate if the broker de-duplicates
// (consumers see it once), else it succeeds or reports a duplicate
// (consumers see it at least once).
func testDuplicateID(t *testing.T, h Harness) {
	topic := h.Topic(t)
	m := newMessage(topic, "dup", []byte("once"))
	if err := publish(t, h.Publisher, []*outbox.Message{m})[0]; err != nil {
		t.Fatalf("first publish: %v", err)
	}
	err := publish(t, h.Publisher, []*outbox.Message{m})[0]
	switch {
	case h.Dedup && !errors.Is(err, outbox.ErrDuplicate):
		t.Fatalf("second publish of the same ID: %v; want an error wrapping outbox.ErrDuplicate (the broker de-duplicates: the relay must learn that it dropped the message)", err)
	case err != nil && !errors.Is(err, outbox.ErrDuplicate):
		t.Fatalf("second publish of the same ID: %v; want nil or an error wrapping outbox.ErrDuplicate", err)
	case err != nil && (outbox.IsPermanent(err) || isBlocked(err)):
		t.Fatalf("second publish of the same ID: %v is permanent or blocked; a duplicate is delivered", err)
	}
	// A marker with the same key: it is delivered after every copy of m.
	marker := newMessage(topic, "dup", []byte("marker"))
	requireAllOK(t, []*outbox.Message{marker}, publish(t, h.Publisher, []*outbox.Message{marker}))
	got := h.Read(t, topic, 2)
	if got[0].ID != m.ID {
		t.Fatalf("first delivery is %q; want the published message %q", got[0].ID, m.ID)
	}
	switch {
	case h.Dedup && got[1].ID != marker.ID:
		t.Fatalf("second delivery is %q; want the marker %q (the broker de-duplicates, so %q must be stored once)", got[1].ID, marker.ID, m.ID)
	case !h.Dedup && got[1].ID != m.ID && got[1].ID != marker.ID:
		t.Fatalf("second delivery is %q; want the duplicate %q or the marker %q", got[1].ID, m.ID, marker.ID)
	}
}

// testClose: after Close, Publish fails every message with an error wrapping
// outbox.ErrClosed, and a second Close does not panic.
func testClose(t *testing.T, h Harness) {
	topic := h.Topic(t)
	if err := h.Publisher.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	msgs := newBatch(topic, 3, func(i int) string { return fmt.Sprintf("k%d", i) })
	errs := publishWithin(t, h.Publisher, context.Background(), msgs, 10*time.Second)
	for i, err := range errs {
		if !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("message %d: Publish after Close returned %v; want an error wrapping outbox.ErrClosed", i, err)
		}
	}
	_ = h.Publisher.Close()
}

// testRestart: the broker restarts while batches are being published. Every
// message acknowledged is readable afterwards; then publishing works again.
func testRestart(t *testing.T, h Harness) {
	if h.Restart == nil {
		t.Skip("the harness has no Restart")
	}
	// Batches are published back to back until Restart has returned, so that
	// the restart happens in the middle of one; maxBatches only bounds the
	// test if the publisher fails fast while the broker is down.
	const batchSize, maxBatches = 100, 200
	topic := h.Topic(t)

	type result struct {
		msgs []*outbox.Message
		errs []error
	}
	stop := make(chan struct{})
	firstDone := make(chan struct{})
	var results []result
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	defer halt() // also if Restart fails the test
	wg.Go(func() {
		for b := range maxBatches {
			if b == 1 {
				close(firstDone)
			}
			select {
			case <-stop:
				return
			default:
			}
			msgs := newBatch(topic, batchSize, func(i int) string { return fmt.Sprintf("k%d", i) })
			ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
			results = append(results, result{msgs, h.Publisher.Publish(ctx, msgs)})
			cancel()
		}
	})
	// Restart once the first batch has returned, so that publishing is in
	// full swing.
	select {
	case <-firstDone:
	case <-waitChan(&wg):
	}
	h.Restart(t)
	halt()

	var acked []string
	failed := map[string]bool{}
	for _, r := range results {
		checkLen(t, r.msgs, r.errs)
		for i, err := range r.errs {
			if outbox.IsPermanent(err) {
				t.Fatalf("message %s failed permanently around the restart: %v; the broker, not the message, was at fault", r.msgs[i].ID, err)
			}
		}
		a, f := split(r.msgs, r.errs)
		acked = append(acked, a...)
		maps.Copy(failed, f)
	}
	t.Logf("%d batches around the restart: %d messages acknowledged, %d failed", len(results), len(acked), len(failed))
	if len(results) > 0 {
		if errs := results[0].errs; errs[0] != nil {
			t.Fatalf("the first batch, before the restart, failed: %v", errs[0])
		}
	}

	acked = append(acked, awaitRecovery(t, h, topic, failed)...)
	readIDs(t, h, topic, acked, failed)
}

// awaitRecovery waits for the publisher to work again after the broker came
// back: it publishes probes until one succeeds, then a whole batch, and
// returns the IDs acknowledged. Failed probes are added to failed.
func awaitRecovery(t *testing.T, h Harness, topic string, failed map[string]bool) (acked []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		probe := newMessage(topic, "probe", []byte("probe"))
		errs := publish(t, h.Publisher, []*outbox.Message{probe})
		if errs[0] == nil {
			acked = append(acked, probe.ID)
			break
		}
		if outbox.IsPermanent(errs[0]) {
			t.Fatalf("probe after the broker came back failed permanently: %v", errs[0])
		}
		failed[probe.ID] = true
		if time.Now().After(deadline) {
			t.Fatalf("publishing still fails 60s after the broker came back: %v", errs[0])
		}
		<-tick.C
	}
	// Once one publish went through, the next batch goes through whole.
	after := newBatch(topic, 100, func(i int) string { return fmt.Sprintf("k%d", i) })
	requireAllOK(t, after, publish(t, h.Publisher, after))
	return append(acked, ids(after)...)
}

// stoppedPublishTimeout bounds each publish made while the broker is
// stopped: publishers that wait for the broker until their deadline (Kafka
// buffers records) fail then.
const stoppedPublishTimeout = 5 * time.Second

// testStopped: with the broker stopped, every message of a publish fails
// with an error blocking its topic (no attempt is spent on it); once the
// broker is back, the publisher recovers and what it acknowledged is
// readable.
func testStopped(t *testing.T, h Harness) {
	if h.Stop == nil {
		t.Skip("the harness has no Stop")
	}
	topic := h.Topic(t)
	before := newBatch(topic, 3, func(i int) string { return fmt.Sprintf("k%d", i) })
	requireAllOK(t, before, publish(t, h.Publisher, before))
	acked := ids(before)
	failed := map[string]bool{}

	start := h.Stop(t)
	started := false
	defer func() {
		if !started { // a failed check must not leave the broker down
			start(t)
		}
	}()
	for round := range 2 { // the first notices the broker is gone, the second finds it gone
		msgs := newBatch(topic, 5, func(i int) string { return fmt.Sprintf("k%d", i) })
		ctx, cancel := context.WithTimeout(context.Background(), stoppedPublishTimeout)
		errs := publishWithin(t, h.Publisher, ctx, msgs, stoppedPublishTimeout+10*time.Second)
		cancel()
		for i, err := range errs {
			if err == nil {
				t.Fatalf("round %d, message %d: acknowledged although the broker is stopped", round, i)
			}
			requireBlocked(t, fmt.Sprintf("round %d, message %d published with the broker stopped to", round, i), topic, err)
			failed[msgs[i].ID] = true
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	started = true
	start(t)
	acked = append(acked, awaitRecovery(t, h, topic, failed)...)
	// Messages that failed may have been stored (an unknown outcome); the
	// acknowledged ones must all be there.
	readIDs(t, h, topic, acked, failed)
}

// Keys and header values that Message.Validate accepts, each of which must
// arrive byte for byte, and those it refuses (control characters, CR and
// LF, leading or trailing spaces), which a publisher handed one anyway
// must deliver byte for byte or fail permanently, never deliver altered.
var (
	acceptedTexts = []string{
		"with inner  spaces", "ключ ✓ 🙂", `quote"and'apostrophe\back`, "a:b;c=d,e", "\u00a0nbsp\u00a0",
		"x=" + strings.Repeat("é", 500),
	}
	refusedTexts = []string{
		"line\nbreak", "cr\rlf", " leading", "trailing ", "\ttab", "bell\a", "nul\x00byte", "c1\u0085control",
	}
)

// testText: keys and header values Validate accepts arrive byte for byte;
// those it refuses are refused with a ValidationError naming the field and,
// published anyway, arrive byte for byte or fail permanently.
func testText(t *testing.T, h Harness) {
	topic := h.Topic(t)
	var msgs []*outbox.Message
	for i, text := range acceptedTexts {
		for j, m := range []*outbox.Message{
			newMessage(topic, text, []byte("accepted key")),
			newMessage(topic, fmt.Sprintf("acc-%d", i), []byte("accepted header")),
		} {
			if j == 1 {
				m.Headers["X-Text"] = text
			}
			if err := m.Validate(0); err != nil {
				t.Fatalf("Validate refuses %q: %v; the suite expects it accepted", text, err)
			}
			msgs = append(msgs, m)
		}
	}
	accepted := len(msgs)
	for i, text := range refusedTexts {
		for j, m := range []*outbox.Message{
			newMessage(topic, text, []byte("refused key")),
			newMessage(topic, fmt.Sprintf("ref-%d", i), []byte("refused header")),
		} {
			field := "Key"
			if j == 1 {
				m.Headers["X-Text"] = text
				field = "Headers"
			}
			var ve *outbox.ValidationError
			if err := m.Validate(0); !errors.As(err, &ve) || ve.Field != field {
				t.Fatalf("Validate of %s %q: %v; want a ValidationError on %s", field, text, err, field)
			}
			msgs = append(msgs, m)
		}
	}
	errs := publish(t, h.Publisher, msgs)
	requireAllOK(t, msgs[:accepted], errs[:accepted])
	var stored []*outbox.Message
	for i, err := range errs {
		switch {
		case err == nil:
			stored = append(stored, msgs[i])
		case !outbox.IsPermanent(err):
			t.Errorf("message with key %q and headers %q: %v; want nil (delivered unaltered) or a permanent error", msgs[i].Key, msgs[i].Headers, err)
		}
	}
	t.Logf("%d of %d refused forms delivered (unaltered, as checked below), the others failed permanently", len(stored)-accepted, len(msgs)-accepted)
	byID := map[string]*outbox.Message{}
	for _, m := range stored {
		byID[m.ID] = m
	}
	for _, r := range h.Read(t, topic, len(stored)) {
		m, ok := byID[r.ID]
		if !ok {
			t.Fatalf("received ID %q, which was not acknowledged or was received twice", r.ID)
		}
		delete(byID, r.ID)
		requireSame(t, m, r)
	}
}

func isBlocked(err error) bool {
	_, ok := outbox.IsBlocked(err)
	return ok
}

// waitChan returns a channel closed when wg is done.
func waitChan(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		wg.Wait()
		close(c)
	}()
	return c
}
