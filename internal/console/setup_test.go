package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/console"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitFor bounds every wait of these tests.
const waitFor = 60 * time.Second

// syncBuffer collects logs written concurrently.
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

// newStore returns a migrated PostgreSQL store in a database of its own.
func newStore(t *testing.T) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), testenv.PostgresDSN(t), postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// write commits msgs in one transaction.
func write(t *testing.T, s *postgres.Store, msgs ...outbox.Message) {
	t.Helper()
	tx, err := s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if err := postgres.Write(t.Context(), tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// deadLetter is a dead letter to insert as the relay would have left it.
type deadLetter struct {
	Topic, Key, LastError string
	Payload               []byte
	Headers               map[string]string
	Attempts              int
	FailedAgo             time.Duration
}

// insertDead inserts dead letters straight into the dead-letter table and
// returns their IDs.
func insertDead(t *testing.T, s *postgres.Store, dls ...deadLetter) []string {
	t.Helper()
	p, err := s.Partitions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range dls {
		id := outbox.NewID()
		var headers *string
		if len(d.Headers) > 0 {
			b, _ := json.Marshal(d.Headers)
			h := string(b)
			headers = &h
		}
		_, err := s.Pool().Exec(t.Context(), `INSERT INTO outbox_dead_letters (id, partition, topic, key, payload, headers, created_at, attempts, last_error, failed_at)
VALUES ($1::uuid, $2, $3, $4, $5, $6::jsonb, now() - interval '1 hour', $7, $8, now() - $9::interval)`,
			id, outbox.PartitionOf(d.Key, p), d.Topic, d.Key, d.Payload, headers, max(d.Attempts, 1), d.LastError, d.FailedAgo.String())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// serve serves a console on addr (127.0.0.1:0 when empty) and returns its
// base URL on 127.0.0.1, its server and the logs.
func serve(t *testing.T, addr string, o console.Options) (string, *console.Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	if o.StoreKind == "" {
		o.StoreKind = "postgres"
	}
	srv, err := console.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("console server: %v", err)
		}
	})
	port := ln.Addr().(*net.TCPAddr).Port
	return fmt.Sprintf("http://127.0.0.1:%d", port), srv, logs
}

// broker is an embedded NATS JetStream with a stream of orders.>.
type broker struct {
	js  jetstream.JetStream
	pub *natsjs.Publisher
}

const streamName = "ORDERS"

func newBroker(t *testing.T) *broker {
	t.Helper()
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.New(js, natsjs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: streamName, Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	return &broker{js: js, pub: pub}
}

// waitPublished waits until the stream holds a message with this ID.
func (b *broker) waitPublished(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	c, err := b.js.OrderedConsumer(ctx, streamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	found := func() bool {
		// Its own context: returning before the batch is complete ends
		// the fetch's goroutine (a goroutine leak at the end otherwise).
		fctx, fcancel := context.WithTimeout(ctx, time.Second)
		defer fcancel()
		batch, err := c.Fetch(100, jetstream.FetchContext(fctx))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if m.Headers().Get("Nats-Msg-Id") == id {
				return true
			}
		}
		return false
	}
	for ctx.Err() == nil {
		if found() {
			return
		}
	}
	t.Fatalf("message %s was not published within %v", id, waitFor)
}

// startRelay starts a relay of s to b.
func startRelay(t *testing.T, s *postgres.Store, b *broker, node string) *outbox.Relay {
	t.Helper()
	r := newRelay(t, s, b, node)
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r
}

func newRelay(t *testing.T, s *postgres.Store, b *broker, node string) *outbox.Relay {
	t.Helper()
	return newRelayConfig(t, s, b, outbox.Config{Node: node, PollInterval: 100 * time.Millisecond})
}

func newRelayConfig(t *testing.T, s *postgres.Store, b *broker, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(s, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
	return r
}

// browse opens a headless Chromium tab.
func browse(t *testing.T) context.Context {
	t.Helper()
	ctx := testenv.Browser(t)
	ctx, cancel := context.WithTimeout(ctx, 3*waitFor)
	t.Cleanup(cancel)
	return ctx
}

// run runs chromedp actions or fails the test.
func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// text returns the text of the first element matching a CSS selector.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// click clicks the first element matching a CSS selector, then waits for
// an element of the page it leads to.
func click(t *testing.T, ctx context.Context, sel, next string) {
	t.Helper()
	run(t, ctx, chromedp.Click(chromedp.CSS(sel)), chromedp.WaitVisible(chromedp.CSS(next)))
}

// open navigates to url and waits for an element.
func open(t *testing.T, ctx context.Context, url, wait string) {
	t.Helper()
	run(t, ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(wait)))
}

// screenshot saves a PNG of the whole page under $OUTBOX_SCREENSHOT_DIR
// (default: outbox-console-screenshots in the temporary directory).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("OUTBOX_SCREENSHOT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "outbox-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// poll calls cond until it returns true, failing the test after waitFor.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitFor)
		}
		<-tick.C
	}
}

// countDead counts the dead letters of the store.
func countDead(t *testing.T, s *postgres.Store, f outbox.DeadLetterFilter) int64 {
	t.Helper()
	n, err := s.CountDeadLetters(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func contains(haystack, needle string) bool { return strings.Contains(haystack, needle) }
