package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/health"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// relay is a health.Relay whose state the test sets.
type relay struct {
	running bool
	contact time.Time
	blocked []outbox.BlockedDestination
}

func (r *relay) Running() bool                        { return r.running }
func (r *relay) LastStoreContact() time.Time          { return r.contact }
func (r *relay) Blocked() []outbox.BlockedDestination { return r.blocked }
func (r *relay) Config() outbox.Config {
	return outbox.Config{HeartbeatInterval: time.Second, PollInterval: 500 * time.Millisecond} // stale after 2.5 s
}

// broker is a publisher with Health.
type broker struct {
	err    error
	probes int
}

func (b *broker) Publish(context.Context, []*outbox.Message) []error { return nil }
func (b *broker) Close() error                                       { return nil }
func (b *broker) Health(context.Context) error                       { b.probes++; return b.err }

type plain struct{}

func (plain) Publish(context.Context, []*outbox.Message) []error { return nil }
func (plain) Close() error                                       { return nil }

func setup(t *testing.T, pub outbox.Publisher) (*health.Checker, *relay, *clock) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := &relay{running: true, contact: clk.now()}
	c, err := health.New(r, pub, health.Options{Grace: 10 * time.Second, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return c, r, clk
}

func get(t *testing.T, c *health.Checker) (int, health.Report) {
	t.Helper()
	rec := httptest.NewRecorder()
	c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var rep health.Report
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return rec.Code, rep
}

func TestBrokerOutageFailsReadinessAfterTheGrace(t *testing.T) {
	b := &broker{}
	c, r, clk := setup(t, b)
	if code, rep := get(t, c); code != 200 || !rep.Ready || rep.Broker.Status != "ok" || rep.Store.Status != "ok" || rep.Relay != "running" {
		t.Fatalf("all up: %d %+v", code, rep)
	}
	b.err = errors.New("nats: not connected")
	clk.add(2 * time.Second)
	r.contact = clk.now()
	code, rep := get(t, c)
	if code != 200 || rep.Broker.Status != "unreachable" || rep.Broker.Error != "nats: not connected" || !rep.Broker.Since.Equal(clk.now()) {
		t.Fatalf("broker just lost: %d %+v; want 200, unreachable since now with the error", code, rep)
	}
	clk.add(10 * time.Second)
	r.contact = clk.now()
	code, rep = get(t, c)
	if code != 503 || rep.Ready || rep.Broker.Status != "down" || rep.Store.Status != "ok" {
		t.Fatalf("broker lost beyond the grace: %d %+v; want 503, broker down, store ok", code, rep)
	}
	b.err = nil
	clk.add(2 * time.Second)
	r.contact = clk.now()
	if code, rep := get(t, c); code != 200 || rep.Broker.Status != "ok" || !rep.Broker.Since.IsZero() {
		t.Fatalf("broker back: %d %+v", code, rep)
	}
}

func TestProbesAreReusedWithinTheInterval(t *testing.T) {
	b := &broker{}
	c, _, clk := setup(t, b)
	c.Check(context.Background())
	c.Check(context.Background())
	if b.probes != 1 {
		t.Errorf("%d probes for two checks at once, want 1", b.probes)
	}
	clk.add(health.ProbeIntervalDefault)
	c.Check(context.Background())
	if b.probes != 2 {
		t.Errorf("%d probes after the probe interval, want 2", b.probes)
	}
}

func TestStoreOutage(t *testing.T) {
	c, r, clk := setup(t, &broker{})
	c.Observe(outbox.Event{Kind: outbox.EventStoreError, Err: errors.New("postgres: connection refused")})
	c.Observe(outbox.Event{Kind: outbox.EventPublished, Count: 1})
	lost := r.contact
	clk.add(3 * time.Second) // past 2 heartbeats + a poll
	code, rep := get(t, c)
	if code != 200 || rep.Store.Status != "unreachable" || !rep.Store.Since.Equal(lost) || rep.Store.Error != "postgres: connection refused" {
		t.Fatalf("store just lost: %d %+v", code, rep)
	}
	clk.add(10 * time.Second)
	if code, rep := get(t, c); code != 503 || rep.Store.Status != "down" || rep.Broker.Status != "ok" {
		t.Fatalf("store lost beyond the grace: %d %+v", code, rep)
	}
	r.contact = clk.now()
	if code, _ := get(t, c); code != 200 {
		t.Fatalf("store back: %d", code)
	}
}

func TestNeverReachedTheStore(t *testing.T) {
	c, r, clk := setup(t, plain{})
	r.contact = time.Time{}
	if code, rep := get(t, c); code != 200 || rep.Store.Status != "unreachable" || rep.Broker.Status != "unchecked" {
		t.Fatalf("at start: %d %+v; want 200 (within the grace), store unreachable, broker unchecked", code, rep)
	}
	clk.add(13 * time.Second)
	if code, rep := get(t, c); code != 503 || rep.Store.Status != "down" {
		t.Fatalf("never reached the store: %d %+v", code, rep)
	}
}

func TestStoppedRelayIsNotReadyAndBlockedIsReported(t *testing.T) {
	c, r, clk := setup(t, &broker{})
	r.blocked = []outbox.BlockedDestination{{Destination: "orders", Since: clk.now(), LastError: "no stream"}}
	code, rep := get(t, c)
	if code != 200 || len(rep.Blocked) != 1 || rep.Blocked[0].Destination != "orders" {
		t.Fatalf("a blocked destination: %d %+v; want 200 with it listed", code, rep)
	}
	r.running = false
	if code, rep := get(t, c); code != 503 || rep.Relay != "stopped" {
		t.Fatalf("stopped relay: %d %+v", code, rep)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := health.New(nil, plain{}, health.Options{}); err == nil {
		t.Error("New(nil relay) succeeded")
	}
	if _, err := health.New(&relay{}, plain{}, health.Options{Grace: -time.Second}); err == nil {
		t.Error("a negative Grace was accepted")
	}
}

// TestAllDestinationsBlocked: blocked destinations with nothing published
// since the last was blocked is "every destination blocked", said in the
// report (readiness stays 200: a restart creates nothing); a publish to
// another destination after that means some still go out.
func TestAllDestinationsBlocked(t *testing.T) {
	c, r, clk := setup(t, &broker{})
	c.Observe(outbox.Event{Kind: outbox.EventPublished, Topic: "invoices", Count: 1})
	clk.add(time.Second)
	r.blocked = []outbox.BlockedDestination{{Destination: "orders", Since: clk.now(), LastError: "no stream covers it"}}
	clk.add(time.Second)
	code, rep := get(t, c)
	if code != 200 || !rep.AllBlocked || !strings.Contains(rep.Detail, "every destination is blocked") || !strings.Contains(rep.Detail, "orders: no stream covers it") {
		t.Fatalf("nothing published since the block: %d %+v", code, rep)
	}
	c.Observe(outbox.Event{Kind: outbox.EventPublished, Topic: "invoices", Count: 1})
	if _, rep := get(t, c); rep.AllBlocked || !strings.Contains(rep.Detail, "1 destination(s) blocked") {
		t.Fatalf("published since the block: %+v", rep)
	}
	r.blocked = nil
	if _, rep := get(t, c); rep.AllBlocked || rep.Detail != "" {
		t.Fatalf("nothing blocked: %+v", rep)
	}
}
