package demo

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// checkRun runs the demo with o and checks that every written message was
// consumed once, in order, and that the output has the summary lines. It
// returns the summary and the output.
func checkRun(t *testing.T, o Options) (Summary, string) {
	t.Helper()
	var out bytes.Buffer
	o.Out = &out
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, o)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if sum.Written == 0 || sum.Orders*eventsPerOrder != sum.Written {
		t.Errorf("written %d messages for %d orders, want 3 per order and some", sum.Written, sum.Orders)
	}
	if sum.ConsumedUnique != sum.Written {
		t.Errorf("consumed unique = %d, written = %d", sum.ConsumedUnique, sum.Written)
	}
	if sum.Published < sum.Written {
		t.Errorf("published %d < written %d", sum.Published, sum.Written)
	}
	if sum.OrderViolations != 0 {
		t.Errorf("order violations = %d", sum.OrderViolations)
	}
	if sum.Throughput <= 0 || sum.LatencyP50 <= 0 || sum.LatencyP99 < sum.LatencyP50 {
		t.Errorf("throughput %v, latency p50 %v p99 %v", sum.Throughput, sum.LatencyP50, sum.LatencyP99)
	}
	text := out.String()
	for _, re := range []string{
		`(?m)^written: +` + strconv.FormatInt(sum.Written, 10) + `$`,
		`(?m)^consumed unique: +` + strconv.FormatInt(sum.ConsumedUnique, 10) + `$`,
		`(?m)^duplicates: +\d+$`,
		`(?m)^order violations: 0$`,
		`(?m)^throughput: +\d+ msg/s$`,
		`(?m)^latency p50: +\S+$`,
		`(?m)^latency p99: +\S+$`,
		`(?m)^order rate: +\d+ orders/s \((\d+ requested|as fast as possible)\)$`,
		`(?m)^(met the rate|fell short|as fast as possible): .*latency p99 \S+ is (above|within) the 50ms target$`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("output lacks a line matching %s", re)
		}
	}
	return sum, text
}

// TestRunDefaults runs the demo on the embedded default (SQLite and NATS)
// for 3 seconds at the CLI's default rate.
func TestRunDefaults(t *testing.T) {
	sum, out := checkRun(t, Options{Duration: 3 * time.Second, Rate: RateDefault})
	if limit := int64(3*RateDefault + ProducersDefault); sum.Orders > limit {
		t.Errorf("%d orders in 3s at %d orders/s, want at most %d", sum.Orders, RateDefault, limit)
	}
	if !strings.Contains(out, "SQLite (embedded") || !strings.Contains(out, "NATS JetStream (embedded)") {
		t.Errorf("header does not name the embedded store and broker")
	}
	if strings.Contains(out, "\r") || !regexp.MustCompile(`(?m)^ +\d+\.\ds  orders \d+`).MatchString(out) {
		t.Errorf("plain output should have periodic progress lines and no carriage returns")
	}
}

// TestRunUnlimitedTerminal runs as fast as possible with one producer and
// one relay worker, few keys, and the terminal progress line.
func TestRunUnlimitedTerminal(t *testing.T) {
	_, out := checkRun(t, Options{Duration: time.Second, Producers: 1, Workers: 1, Keys: 5, Terminal: true})
	if !strings.Contains(out, "\r") {
		t.Errorf("terminal output has no carriage return redraws")
	}
}

// TestRunPostgres runs the demo on PostgreSQL: the outbox and the order
// tables live in a schema of their own, dropped at the end.
func TestRunPostgres(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	_, out := checkRun(t, Options{Store: dsn, Duration: 2 * time.Second, Rate: 500})
	if !strings.Contains(out, "PostgreSQL (") {
		t.Errorf("header does not name PostgreSQL")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left []string
	rows, err := conn.Query(ctx, "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'outbox_demo_%'")
	if err != nil {
		t.Fatal(err)
	}
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("demo schemas left behind: %v", left)
	}
}
func TestValidate(t *testing.T) {
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Duration: -time.Second}, "Duration"},
		{Options{Rate: -1}, "Rate"},
		{Options{Keys: -1}, "Keys"},
		{Options{Producers: ProducersMax + 1}, "Producers"},
		{Options{Workers: -2}, "Workers"},
		{Options{Store: "mysql://x"}, "Store"},
		{Options{Broker: "amqp://guest:secret@x"}, "Broker"},
	} {
		_, err := Run(context.Background(), c.o)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Run(%+v) = %v, want an error naming %s", c.o, err, c.field)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error %q shows a password", err)
		}
	}
}

// syncBuffer is an output buffer safe for concurrent use that signals
// each write.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.written <- struct{}{}:
	default:
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunCancel: cancelling the context ends a long run promptly, with the
// context's error and the summary still printed.
func TestRunCancel(t *testing.T) {
	out := &syncBuffer{written: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var sum Summary
	var err error
	go func() {
		defer close(done)
		sum, err = Run(ctx, Options{Duration: time.Hour, Rate: 200, Out: out})
	}()
	// Cancel once orders are flowing, as a progress line shows.
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for !regexp.MustCompile(`orders [1-9]`).MatchString(out.String()) {
		select {
		case <-out.written:
		case <-done:
			t.Fatalf("Run ended early: %v\n%s", err, out.String())
		case <-deadline.C:
			t.Fatalf("no progress line with orders within a minute:\n%s", out.String())
		}
	}
	cancel()
	select {
	case <-done:
	case <-deadline.C:
		t.Fatal("Run did not return within a minute of cancellation")
	}
	t.Logf("output:\n%s", out.String())
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel = %v, want context.Canceled", err)
	}
	if sum.Orders == 0 || !strings.Contains(out.String(), "order violations: ") {
		t.Errorf("summary after cancel: %+v", sum)
	}
}

// TestSummaryVerdict: the summary says whether a run met the requested
// rate and the latency target, with the figures (numbers injected, no
// run).
func TestSummaryVerdict(t *testing.T) {
	for _, c := range []struct {
		name     string
		sum      Summary
		short    bool
		over     bool
		verdict  string
		rateLine string
	}{
		{"fell short", Summary{RequestedRate: 2000, OrderRate: 1840.4, LatencyP99: 63 * time.Millisecond}, true, true,
			"fell short: 1,840 of 2,000 orders/s requested; latency p99 63ms is above the 50ms target",
			"order rate:       1840 orders/s (2000 requested)"},
		{"short, latency fine", Summary{RequestedRate: 12000, OrderRate: 9000, LatencyP99: 12 * time.Millisecond}, true, false,
			"fell short: 9,000 of 12,000 orders/s requested; latency p99 12ms is within the 50ms target",
			"order rate:       9000 orders/s (12000 requested)"},
		{"met within tolerance", Summary{RequestedRate: 2000, OrderRate: 1985, LatencyP99: 50 * time.Millisecond}, false, false,
			"met the rate: 2,000 orders/s requested, 1,985 placed; latency p99 50ms is within the 50ms target",
			"order rate:       1985 orders/s (2000 requested)"},
		{"as fast as possible", Summary{OrderRate: 1234567, LatencyP99: 2 * time.Second}, false, true,
			"as fast as possible: 1,234,567 orders/s; latency p99 2s is above the 50ms target",
			"order rate:       1234567 orders/s (as fast as possible)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.sum
			s.judge()
			if s.FellShort != c.short || s.LatencyOverTarget != c.over {
				t.Errorf("FellShort, LatencyOverTarget = %v, %v; want %v, %v", s.FellShort, s.LatencyOverTarget, c.short, c.over)
			}
			if got := s.Verdict(); got != c.verdict {
				t.Errorf("Verdict() = %q\nwant         %q", got, c.verdict)
			}
			var out bytes.Buffer
			if err := s.Print(&out); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if last := lines[len(lines)-1]; last != c.verdict {
				t.Errorf("last line of the summary = %q, want the verdict %q", last, c.verdict)
			}
			if !slices.Contains(lines, c.rateLine) || !slices.Contains(lines, "order violations: 0") {
				t.Errorf("summary lacks %q or the order violations line:\n%s", c.rateLine, out.String())
			}
		})
	}
}

// TestRelayOrdersAcrossTopics: the consumer checks a customer's order
// across the three topics of its events, so the relay must keep a key's
// order across topics (the relay's default scope orders each topic alone).
func TestRelayOrdersAcrossTopics(t *testing.T) {
	cfg := relayConfig(Options{Workers: 2}, slog.New(slog.DiscardHandler), &counters{})
	if cfg.OrderScope != outbox.OrderScopeKey {
		t.Fatalf("the demo relay's OrderScope is %q; its consumer checks order across topics and needs %q", cfg.OrderScope, outbox.OrderScopeKey)
	}
	msgs, err := orderMessages(order{Customer: "c"}, eventsPerOrder)
	if err != nil {
		t.Fatal(err)
	}
	topics := map[string]bool{}
	for _, m := range msgs {
		topics[m.Topic] = true
	}
	if len(topics) < 2 {
		t.Fatalf("an order's events go to %d topic(s); this test assumes several", len(topics))
	}
}
