package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
)

func msg(topic, key string, payload []byte) *outbox.Message {
	return &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: payload, CreatedAt: time.Now()}
}

func publish(t *testing.T, p outbox.Publisher, msgs ...*outbox.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts  natsjs.Options
		field string // "" = valid
	}{
		{natsjs.Options{}, ""},
		{natsjs.Options{MaxInFlight: 1, AckTimeout: time.Millisecond, SubjectPrefix: "outbox."}, ""},
		{natsjs.Options{SubjectPrefix: "prod-"}, ""},
		{natsjs.Options{SubjectPrefix: "a.b_c.d-e."}, ""},
		{natsjs.Options{MaxInFlight: -1}, "MaxInFlight"},
		{natsjs.Options{MaxInFlight: natsjs.MaxInFlightMax + 1}, "MaxInFlight"},
		{natsjs.Options{AckTimeout: -time.Second}, "AckTimeout"},
		{natsjs.Options{AckTimeout: time.Microsecond}, "AckTimeout"},
		{natsjs.Options{SubjectPrefix: ".outbox."}, "SubjectPrefix"},
		{natsjs.Options{SubjectPrefix: "a..b."}, "SubjectPrefix"},
		{natsjs.Options{SubjectPrefix: "outbox.*."}, "SubjectPrefix"},
		{natsjs.Options{SubjectPrefix: "out box."}, "SubjectPrefix"},
		{natsjs.Options{SubjectPrefix: "."}, "SubjectPrefix"},
	} {
		p, err := natsjs.New(fakeJS{}, tc.opts)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("New(%+v): %v; want no error", tc.opts, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("New(%+v): error %v; want one naming %s", tc.opts, err, tc.field)
		}
		if p != nil {
			p.Close()
		}
	}
	if _, err := natsjs.New(nil, natsjs.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := natsjs.Dial("nats://127.0.0.1:1", natsjs.Options{MaxInFlight: -1}); err == nil || !strings.Contains(err.Error(), "MaxInFlight") {
		t.Errorf("Dial with bad options: %v; want an error naming MaxInFlight", err)
	}
}

// fakeJS satisfies jetstream.JetStream for option validation only.
type fakeJS struct{ jetstream.JetStream }

func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	url := "nats://alice:s3cret@" + addr
	_, err = natsjs.Dial(url, natsjs.Options{})
	if err == nil {
		t.Fatalf("Dial(%s) succeeded with no server", url)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q does not name the address %s", err, addr)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the password", err)
	}
}

// TestHeadersOnTheWire checks the subject and every header as stored by
// JetStream.
func TestHeadersOnTheWire(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, nil)
	m := msg(topic, "order-42", []byte("payload"))
	m.Headers = map[string]string{"Content-Type": "text/plain", "x-lower": "kept as is"}
	noKey := msg(topic, "", []byte("no key"))
	for i, err := range publish(t, p, m, noKey) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored, err := b.streamOf(t, topic).GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := testPrefix + topic; stored.Subject != want {
		t.Errorf("subject %q; want %q", stored.Subject, want)
	}
	want := map[string]string{
		"Nats-Msg-Id":       m.ID,
		"Outbox-Id":         m.ID,
		"Outbox-Key":        "order-42",
		"Outbox-Created-At": m.CreatedAt.UTC().Format(time.RFC3339Nano),
		"Content-Type":      "text/plain",
		"x-lower":           "kept as is",
	}
	for k, v := range want {
		if got := stored.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q; want [%q]", k, got, v)
		}
	}
	if len(stored.Header) != len(want) {
		t.Errorf("headers %v; want exactly %v", stored.Header, want)
	}
	ts, err := time.Parse(time.RFC3339Nano, stored.Header.Get("Outbox-Created-At"))
	if err != nil || !ts.Equal(m.CreatedAt) {
		t.Errorf("Outbox-Created-At parses to %v, %v; want %v", ts, err, m.CreatedAt)
	}
	second, err := b.streamOf(t, topic).GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, has := second.Header["Outbox-Key"]; has {
		t.Errorf("a message without key carries Outbox-Key %q", second.Header.Get("Outbox-Key"))
	}
}

// TestDuplicateIsReportedAndStoredOnce re-publishes one ID, in separate
// calls and twice in one call: the first result is nil, every later one
// wraps outbox.ErrDuplicate (and is neither permanent nor blocked), and the
// stream holds the message once.
func TestDuplicateIsReportedAndStoredOnce(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, func(c *jetstream.StreamConfig) { c.Duplicates = time.Minute })
	m := msg(topic, "k", []byte("once"))
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("first publish: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, outbox.ErrDuplicate) {
			t.Fatalf("%s: %v; want an error wrapping outbox.ErrDuplicate", what, err)
		}
		if _, blocked := outbox.IsBlocked(err); blocked || outbox.IsPermanent(err) {
			t.Fatalf("%s: %v is classified blocked or permanent; a duplicate is delivered", what, err)
		}
		if !strings.Contains(err.Error(), m.ID) || !strings.Contains(err.Error(), "sequence 1") {
			t.Errorf("%s: %v does not name the ID and the stored sequence", what, err)
		}
	}
	check("re-publish", publish(t, p, m)[0])
	for i, err := range publish(t, p, m, m) {
		check(fmt.Sprintf("result %d of the same ID twice in one call", i), err)
	}
	info, err := b.streamOf(t, topic).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("the stream holds %d messages; want 1", info.State.Msgs)
	}
}

// TestStreamFullIsBlocked: a stream full with DiscardNew refuses the rest of
// the batch with errors blocking the topic, not the messages.
func TestStreamFullIsBlocked(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, func(c *jetstream.StreamConfig) {
		c.MaxMsgs = 5
		c.Discard = jetstream.DiscardNew
	})
	var msgs []*outbox.Message
	for i := range 8 {
		msgs = append(msgs, msg(topic, fmt.Sprint("k", i), []byte("x")))
	}
	errs := publish(t, p, msgs...)
	for i, err := range errs {
		switch {
		case i < 5 && err != nil:
			t.Errorf("message %d: %v; want nil", i, err)
		case i >= 5 && err == nil:
			t.Errorf("message %d was accepted by a full stream", i)
		case i >= 5 && !isBlocked(err, topic):
			t.Errorf("message %d: %v; want an error blocking destination %q (a full stream is no fault of the message)", i, err, topic)
		case i >= 5 && !strings.Contains(err.Error(), "maximum messages"):
			t.Errorf("message %d: %v; want it to say the maximum was reached", i, err)
		}
	}
}

// TestStreamMaxMsgSizeIsPermanent: a message over the stream's
// max_msg_size (under the server's max_payload) fails permanently, alone.
func TestStreamMaxMsgSizeIsPermanent(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1000 })
	errs := publish(t, p,
		msg(topic, "a", []byte("small")),
		msg(topic, "b", make([]byte, 2000)),
		msg(topic, "c", []byte("small")))
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("small messages failed: %v, %v", errs[0], errs[2])
	}
	if !outbox.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "max_msg_size") {
		t.Fatalf("message over max_msg_size: %v; want a permanent error naming max_msg_size", errs[1])
	}
}

// isBlocked reports whether err blocks destination topic (and is not
// permanent).
func isBlocked(err error, topic string) bool {
	dest, ok := outbox.IsBlocked(err)
	return ok && dest == topic && !outbox.IsPermanent(err)
}

// TestSealedStreamIsBlocked: a sealed stream blocks its topic.
func TestSealedStreamIsBlocked(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, nil)
	s := b.streamOf(t, topic)
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := b.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatalf("seal stream: %v", err)
	}
	err := publish(t, p, msg(topic, "", []byte("x")))[0]
	if !isBlocked(err, topic) || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("publish to a sealed stream: %v; want an error blocking %q that says the stream is sealed", err, topic)
	}
}

func TestNoStreamIsBlockedAndSaysWhatToDo(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	err := publish(t, p, msg("nowhere.to.go", "", []byte("x")))[0]
	if !isBlocked(err, "nowhere.to.go") {
		t.Fatalf("publish without stream: %v; want an error blocking destination nowhere.to.go", err)
	}
	for _, want := range []string{`"outbox.nowhere.to.go"`, "create a stream"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("error %q does not wrap jetstream.ErrNoStreamResponse", err)
	}
}

// redirectJS publishes to "elsewhere."+subject, where no stream listens,
// to simulate a stream that exists but does not answer.
type redirectJS struct{ jetstream.JetStream }

func (r redirectJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	m.Subject = "elsewhere." + m.Subject
	return r.JetStream.PublishMsgAsync(m, opts...)
}

func TestNoResponderWithStreamIsBlocked(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p, err := natsjs.New(redirectJS{b.js}, natsjs.Options{SubjectPrefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	topic := b.stream(t, nil)
	err = publish(t, p, msg(topic, "", []byte("x")))[0]
	if !isBlocked(err, topic) {
		t.Fatalf("no responder although a stream covers the subject: %v; want an error blocking %q", err, topic)
	}
	if !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("error %q does not say the stream did not answer", err)
	}
}

func TestJetStreamDisabledIsBlocked(t *testing.T) {
	t.Parallel()
	// A plain NATS server without JetStream (testenv's has JetStream).
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	p, err := natsjs.Dial(srv.ClientURL(), natsjs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = publish(t, p, msg("orders", "", []byte("x")))[0]
	if !isBlocked(err, "orders") || !strings.Contains(err.Error(), "JetStream is not enabled") {
		t.Fatalf("publish without JetStream: %v; want an error blocking \"orders\" saying JetStream is not enabled", err)
	}
}

// TestAckTimeout: a plain subscriber that never answers takes the place of
// a stream; without a deadline on ctx, Publish gives up after AckTimeout
// with an error blocking the topic (the message may be stored: no attempt
// is spent on it).
func TestAckTimeout(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	sub, err := b.nc.SubscribeSync(testPrefix + "silent")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix, AckTimeout: 200 * time.Millisecond})
	start := time.Now()
	errs := p.Publish(context.Background(), []*outbox.Message{msg("silent", "", []byte("x"))})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Publish took %v with AckTimeout 200ms", took)
	}
	if !isBlocked(errs[0], "silent") {
		t.Fatalf("unanswered publish: %v; want an error blocking \"silent\"", errs[0])
	}
	if !errors.Is(errs[0], context.DeadlineExceeded) && !errors.Is(errs[0], jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("unanswered publish: %v; want a timeout", errs[0])
	}
}

// countingJS records the most async publishes awaiting acknowledgement
// seen by PublishMsgAsync (including the one being made).
type countingJS struct {
	jetstream.JetStream
	max atomic.Int64
}

func (c *countingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	n := int64(c.JetStream.PublishAsyncPending()) + 1
	for {
		cur := c.max.Load()
		if n <= cur || c.max.CompareAndSwap(cur, n) {
			break
		}
	}
	return c.JetStream.PublishMsgAsync(m, opts...)
}

// countingPublisher returns a Publisher of MaxInFlight maxInFlight on b
// whose publishes cjs counts (closed at the end of the test).
func countingPublisher(t *testing.T, b *broker, maxInFlight int) (p *natsjs.Publisher, cjs *countingJS) {
	t.Helper()
	js, err := jetstream.New(b.nc) // no PublishAsyncMaxPending
	if err != nil {
		t.Fatal(err)
	}
	cjs = &countingJS{JetStream: js}
	p, err = natsjs.New(cjs, natsjs.Options{MaxInFlight: maxInFlight, SubjectPrefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, cjs
}

// TestMaxInFlightBound: four concurrent calls share the MaxInFlight bound,
// with a JetStream context that has no bound of its own.
func TestMaxInFlightBound(t *testing.T) {
	t.Parallel()
	const maxInFlight = 8
	b := newBroker(t)
	p, cjs := countingPublisher(t, b, maxInFlight)
	topic := b.stream(t, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			msgs := make([]*outbox.Message, 500)
			for i := range msgs {
				msgs[i] = msg(topic, fmt.Sprintf("g%d-%d", g, i), []byte("x"))
			}
			for i, err := range p.Publish(context.Background(), msgs) {
				if err != nil {
					t.Errorf("goroutine %d, message %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := cjs.max.Load()
	if got > maxInFlight {
		t.Fatalf("%d publishes awaited acknowledgement at once; MaxInFlight is %d", got, maxInFlight)
	}
	if got < 2 {
		t.Fatalf("at most %d publish awaited acknowledgement at once: the batch was not pipelined", got)
	}
	t.Logf("most publishes in flight: %d (MaxInFlight %d)", got, maxInFlight)
}

// TestMaxInFlightBoundSmallCalls: small calls (a steady load's, sent and
// awaited in the caller's goroutine when their tokens are free, side by
// side otherwise) from many goroutines share the bound too, every message
// is stored once, and no token is lost: none is taken once the calls
// returned, and a call of MaxInFlight messages made afterwards goes
// through.
func TestMaxInFlightBoundSmallCalls(t *testing.T) {
	t.Parallel()
	const maxInFlight = 8
	b := newBroker(t)
	p, cjs := countingPublisher(t, b, maxInFlight)
	topic := b.stream(t, nil)
	const goroutines, calls, perCall = 6, 40, 3
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for c := range calls {
				msgs := make([]*outbox.Message, perCall)
				for i := range msgs {
					msgs[i] = msg(topic, fmt.Sprintf("g%d-%d-%d", g, c, i), []byte("x"))
				}
				for i, err := range publish(t, p, msgs...) {
					if err != nil {
						t.Errorf("goroutine %d, call %d, message %d: %v", g, c, i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if got := cjs.max.Load(); got > maxInFlight {
		t.Fatalf("%d publishes awaited acknowledgement at once; MaxInFlight is %d", got, maxInFlight)
	}
	if held := natsjs.TokensHeld(p); held != 0 {
		t.Fatalf("%d of the MaxInFlight tokens are still taken after every call returned", held)
	}
	last := make([]*outbox.Message, maxInFlight)
	for i := range last {
		last[i] = msg(topic, fmt.Sprintf("last-%d", i), []byte("x"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, err := range p.Publish(ctx, last) {
		if err != nil {
			t.Fatalf("a call of MaxInFlight messages after the small ones, message %d: %v (a token was not given back)", i, err)
		}
	}
	want := goroutines*calls*perCall + maxInFlight
	info, err := b.streamOf(t, topic).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int(info.State.Msgs) != want {
		t.Fatalf("the stream holds %d messages, want %d", info.State.Msgs, want)
	}
}

// TestNewLeavesConnectionOpen: a Publisher from New does not close the
// caller's connection; one from Dial closes its own.
func TestNewLeavesConnectionOpen(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p, err := natsjs.New(b.js, natsjs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if b.nc.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := publish(t, p, msg("x", "", nil))[0]; !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Publish after Close: %v; want outbox.ErrClosed", err)
	}
}

// TestCloseWaitsForPublish: Close returns only after a Publish in progress
// has returned, and that Publish's acknowledged messages are stored.
func TestCloseWaitsForPublish(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p, err := natsjs.Dial(b.url, natsjs.Options{SubjectPrefix: testPrefix}, natsOpts...)
	if err != nil {
		t.Fatal(err)
	}
	topic := b.stream(t, nil)
	msgs := make([]*outbox.Message, 2000)
	for i := range msgs {
		msgs[i] = msg(topic, fmt.Sprint("k", i), []byte("x"))
	}
	started := make(chan struct{})
	done := make(chan []error, 1)
	go func() {
		close(started)
		done <- p.Publish(context.Background(), msgs)
	}()
	<-started
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	errs := <-done
	acked := 0
	for _, err := range errs {
		if err == nil {
			acked++
		} else if !errors.Is(err, outbox.ErrClosed) {
			t.Fatalf("Publish racing Close: %v; want nil or ErrClosed", err)
		}
	}
	info, err := b.streamOf(t, topic).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(acked) {
		t.Fatalf("%d messages acknowledged, %d stored", acked, info.State.Msgs)
	}
	t.Logf("%d of %d acknowledged before Close", acked, len(msgs))
}

// TestCancelledIsRetryableNotBlocked: a call cancelled (not timed out)
// leaves its messages retryable: the destination did nothing wrong.
func TestCancelledIsRetryableNotBlocked(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix})
	topic := b.stream(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Publish(ctx, []*outbox.Message{msg(topic, "", []byte("x"))})[0]
	if err == nil || outbox.IsPermanent(err) {
		t.Fatalf("cancelled publish: %v; want a retryable error", err)
	}
	if _, blocked := outbox.IsBlocked(err); blocked {
		t.Fatalf("cancelled publish: %v blocks the destination; a cancellation says nothing about it", err)
	}
}

// TestPublishWhileDisconnectedFailsForCertain: with the server down, a
// publish fails at once and blocks its topic, and the message is not sent
// after the reconnection (no reconnect buffer): the failure is certain,
// never "maybe stored". Only the message published after the restart is
// in the stream.
func TestPublishWhileDisconnectedFailsForCertain(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := b.dial(t, natsjs.Options{SubjectPrefix: testPrefix, AckTimeout: 2 * time.Second})
	topic := b.stream(t, nil)
	before := msg(topic, "k", []byte("before"))
	if err := publish(t, p, before)[0]; err != nil {
		t.Fatal(err)
	}
	start := b.stop(t)
	down := []*outbox.Message{msg(topic, "k1", []byte("down 1")), msg(topic, "k2", []byte("down 2"))}
	for i, err := range publish(t, p, down...) {
		if !isBlocked(err, topic) {
			t.Fatalf("message %d published with the server down: %v; want an error blocking %q", i, err, topic)
		}
	}
	start(t)
	// Publish until one goes through (the client reconnects on its own).
	var after *outbox.Message
	deadline := time.Now().Add(30 * time.Second)
	for {
		after = msg(topic, "k", []byte("after"))
		err := publish(t, p, after)[0]
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publishing still fails 30s after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not synchronising
	}
	got := b.read(t, topic, 2)
	if got[0].ID != before.ID {
		t.Fatalf("first stored message %s; want %s", got[0].ID, before.ID)
	}
	for _, m := range down {
		if got[1].ID == m.ID {
			t.Fatalf("message %s, reported failed while the server was down, was stored after the reconnection", m.ID)
		}
	}
	if got[1].ID != after.ID {
		t.Fatalf("second stored message %s; want %s", got[1].ID, after.ID)
	}
}

// TestPermissionViolationIsBlocked: the server drops a publish the user may
// not make and says so asynchronously; the publish blocks its topic (after
// AckTimeout) and the error carries the server's reason.
func TestPermissionViolationIsBlocked(t *testing.T) {
	t.Parallel()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{{
			Username: "relay", Password: "pw",
			Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{testPrefix + "secret.>"}},
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	url := fmt.Sprintf("nats://relay:pw@%s", srv.Addr())
	nc := connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ALL", Subjects: []string{testPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	p, err := natsjs.Dial(url, natsjs.Options{SubjectPrefix: testPrefix, AckTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	errs := p.Publish(context.Background(), []*outbox.Message{msg("open.door", "", []byte("ok")), msg("secret.door", "", []byte("no"))})
	if errs[0] != nil {
		t.Fatalf("allowed subject: %v", errs[0])
	}
	if !isBlocked(errs[1], "secret.door") {
		t.Fatalf("denied subject: %v; want an error blocking secret.door", errs[1])
	}
	if !strings.Contains(strings.ToLower(errs[1].Error()), "permissions violation") {
		t.Errorf("denied subject: %v does not carry the server's permissions violation", errs[1])
	}
}
