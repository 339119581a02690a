// Package demo is the engine of `outbox demo`: a small order service that
// writes orders and their events through the outbox, a relay that drains
// them to a broker, and a consumer that applies them idempotently and checks
// per-key order, ending with a summary of what arrived and how fast.
//
// With the zero Options it needs nothing but Go: the store is SQLite in a
// temporary directory and the broker an embedded NATS server with
// JetStream.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Defaults and limits of [Options].
const (
	DurationDefault = 15 * time.Second
	// RateDefault is the CLI's default rate, orders per second (3,000
	// messages per second): what the embedded default (SQLite and NATS)
	// sustains with p99 within LatencyTarget on a shared 2-core machine.
	// There, at load 4.5-6.9, five 10 s runs of each: 1,000 met both in
	// every run (p99 median 9.6 ms), 1,500 met the rate in all and p99 in
	// four (median 20.4 ms), 2,000 met both in three. At load 10 or more
	// no rate kept p99 within 50 ms; the summary says when a run falls
	// short.
	RateDefault      = 1000
	KeysDefault      = 100
	ProducersDefault = 4
	WorkersDefault   = outbox.WorkersDefault

	KeysMax      = 1_000_000
	ProducersMax = 256

	// DrainTimeout bounds the wait, after producing stops, for every
	// written message to be consumed.
	DrainTimeout = time.Minute

	// LatencyTarget is the p99 latency the demo's default rate is chosen
	// to stay within; the summary says when a run's p99 is above it.
	LatencyTarget = 50 * time.Millisecond
	// rateTolerance is how far below the requested rate a run may place
	// orders and still count as meeting it (the last order in progress
	// when producing stops, timer granularity).
	rateTolerance = 0.01

	// eventsPerOrder is how many messages each order writes.
	eventsPerOrder = 3
)

// Options configures [Run]. The zero value of a field means its default,
// except Rate, where 0 means as fast as possible.
type Options struct {
	// Store is "" for SQLite in a temporary directory (the embedded
	// default) or a postgres:// URL. In PostgreSQL the demo works in a new
	// schema, outbox_demo_<random>, which it drops at the end.
	Store string
	// Broker is "" for an embedded NATS server with JetStream, or a
	// nats:// URL of a server with JetStream enabled. On an external server
	// the demo uses its own stream and subject prefix, and deletes the
	// stream at the end.
	Broker string
	// Duration is how long orders are produced; default [DurationDefault].
	Duration time.Duration
	// Rate is the number of orders per second, all producers together; 0
	// means as fast as possible. The CLI's default is [RateDefault]. Each
	// order writes 3 messages.
	Rate int
	// Keys is the number of customers, the messages' keys; default
	// [KeysDefault].
	Keys int
	// Producers is the number of goroutines placing orders concurrently;
	// default [ProducersDefault].
	Producers int
	// Workers is the relay's number of workers; default [WorkersDefault].
	Workers int
	// Out receives the progress and the summary; default io.Discard.
	Out io.Writer
	// Terminal makes the progress a single line redrawn every 250 ms (for
	// a terminal); otherwise a plain line is printed every second.
	Terminal bool
	// Logger receives the relay's and the demo's logs; default discard.
	Logger *slog.Logger
}

// WithDefaults returns a copy of o with the zero fields set to their
// defaults.
func (o Options) WithDefaults() Options {
	if o.Duration == 0 {
		o.Duration = DurationDefault
	}
	if o.Keys == 0 {
		o.Keys = KeysDefault
	}
	if o.Producers == 0 {
		o.Producers = ProducersDefault
	}
	if o.Workers == 0 {
		o.Workers = WorkersDefault
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports the first invalid field of o (after defaults), naming it.
func (o Options) Validate() error {
	switch {
	case o.Duration < 0:
		return fmt.Errorf("demo: Duration must be positive, got %v", o.Duration)
	case o.Rate < 0:
		return fmt.Errorf("demo: Rate must be 0 (as fast as possible) or a positive number of orders per second, got %d", o.Rate)
	case o.Keys < 1 || o.Keys > KeysMax:
		return fmt.Errorf("demo: Keys must be between 1 and %d, got %d", KeysMax, o.Keys)
	case o.Producers < 1 || o.Producers > ProducersMax:
		return fmt.Errorf("demo: Producers must be between 1 and %d, got %d", ProducersMax, o.Producers)
	case o.Workers < 1 || o.Workers > outbox.WorkersMax:
		return fmt.Errorf("demo: Workers must be between 1 and %d, got %d", outbox.WorkersMax, o.Workers)
	}
	if o.Store != "" && !strings.HasPrefix(o.Store, "postgres://") && !strings.HasPrefix(o.Store, "postgresql://") {
		return fmt.Errorf("demo: Store must be empty (embedded SQLite) or a postgres:// URL, got %q", redact.URL(o.Store))
	}
	if o.Broker != "" && !strings.HasPrefix(o.Broker, "nats://") {
		return fmt.Errorf("demo: Broker must be empty (embedded NATS) or a nats:// URL, got %q", redact.URL(o.Broker))
	}
	return nil
}

// Summary is the outcome of a demo run.
type Summary struct {
	// Orders is the number of orders committed.
	Orders int64 `json:"orders"`
	// Written is the number of messages committed to the outbox.
	Written int64 `json:"written"`
	// Published is the number of messages the broker acknowledged to the
	// relay (retries of a message count again).
	Published int64 `json:"published"`
	// ConsumedUnique is the number of distinct messages the consumer
	// applied; Duplicates the deliveries it recognised and skipped.
	ConsumedUnique int64 `json:"consumed_unique"`
	Duplicates     int64 `json:"duplicates"`
	// OrderViolations counts first deliveries whose per-customer sequence
	// number was not the one after the previous delivery's.
	OrderViolations int64 `json:"order_violations"`
	// RequestedRate is Options.Rate, orders per second; 0 means as fast
	// as possible.
	RequestedRate int `json:"requested_rate"`
	// OrderRate is the rate achieved: Orders / Producing, orders per
	// second.
	OrderRate float64 `json:"order_rate"`
	// Producing is how long the producers placed orders: Options.Duration,
	// or less if the run was cut short.
	Producing time.Duration `json:"producing_ns"`
	// Elapsed runs from the first order to the last consumed message.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Throughput is ConsumedUnique / Elapsed, in messages per second.
	Throughput float64 `json:"throughput"`
	// LatencyP50 and LatencyP99 are quantiles of the time from a message's
	// write (its CreatedAt, set just before its transaction commits) to
	// its first consumption.
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	// FellShort is true when a rate was requested and OrderRate is below
	// it (by more than 1%): the store, the relay or the machine could not
	// keep up.
	FellShort bool `json:"fell_short"`
	// LatencyOverTarget is true when LatencyP99 is above [LatencyTarget].
	LatencyOverTarget bool `json:"latency_over_target"`
}

// judge sets FellShort and LatencyOverTarget from the other fields.
func (s *Summary) judge() {
	s.FellShort = s.RequestedRate > 0 && s.OrderRate < float64(s.RequestedRate)*(1-rateTolerance)
	s.LatencyOverTarget = s.LatencyP99 > LatencyTarget
}

// Verdict is the summary's last line: whether the run placed orders at the
// requested rate and kept p99 within [LatencyTarget], with the figures, such
// as "fell short: 1,840 of 2,000 orders/s requested; latency p99 63ms is
// above the 50ms target".
func (s Summary) Verdict() string {
	var rate string
	switch {
	case s.RequestedRate == 0:
		rate = fmt.Sprintf("as fast as possible: %s orders/s", thousands(int64(math.Round(s.OrderRate))))
	case s.FellShort:
		rate = fmt.Sprintf("fell short: %s of %s orders/s requested", thousands(int64(math.Round(s.OrderRate))), thousands(int64(s.RequestedRate)))
	default:
		rate = fmt.Sprintf("met the rate: %s orders/s requested, %s placed", thousands(int64(s.RequestedRate)), thousands(int64(math.Round(s.OrderRate))))
	}
	lat := roundLatency(s.LatencyP99)
	if s.LatencyOverTarget {
		return fmt.Sprintf("%s; latency p99 %v is above the %v target", rate, lat, LatencyTarget)
	}
	return fmt.Sprintf("%s; latency p99 %v is within the %v target", rate, lat, LatencyTarget)
}

// thousands formats n ≥ 0 with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Print writes the summary as an aligned table followed by its
// [Summary.Verdict]; one of its lines is exactly "order violations: N".
func (s Summary) Print(w io.Writer) error {
	requested := "as fast as possible"
	if s.RequestedRate > 0 {
		requested = fmt.Sprintf("%d requested", s.RequestedRate)
	}
	_, err := fmt.Fprintf(w, ""+
		"orders:           %d\n"+
		"order rate:       %.0f orders/s (%s)\n"+
		"written:          %d\n"+
		"published:        %d\n"+
		"consumed unique:  %d\n"+
		"duplicates:       %d\n"+
		"order violations: %d\n"+
		"throughput:       %.0f msg/s\n"+
		"latency p50:      %v\n"+
		"latency p99:      %v\n"+
		"(latencies over every message consumed, those of the last orders too:\n"+
		"the progress lines showed the p99 of the messages consumed so far)\n"+
		"\n%s\n",
		s.Orders, s.OrderRate, requested, s.Written, s.Published, s.ConsumedUnique, s.Duplicates, s.OrderViolations,
		s.Throughput, roundLatency(s.LatencyP50), roundLatency(s.LatencyP99), s.Verdict())
	return err
}

func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// counters are the live totals shared by the demo's goroutines.
type counters struct {
	orders     atomic.Int64
	written    atomic.Int64
	published  atomic.Int64
	unique     atomic.Int64
	duplicates atomic.Int64
	violations atomic.Int64
	lastAt     atomic.Int64 // unix nanos of the last consumed message
	latency    histogram
	progress   chan struct{} // a value after each consumed batch, coalesced
}

// Run runs the demo: it sets up the store and the broker, produces orders
// for o.Duration, waits (at most [DrainTimeout]) until every written
// message has been consumed, tears everything down, prints the summary to
// o.Out, and returns it. Cancelling ctx stops the run early: the summary is
// still printed and returned, with ctx's error.
//
// The error is not nil if setup fails, a producer's or the consumer's
// transaction fails, or the backlog does not drain in time.
func Run(ctx context.Context, o Options) (Summary, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	log := o.Logger
	runID := strings.ToLower(outbox.NewID()[24:32])

	// Deferred calls tear down in reverse order: relay, consumer, broker,
	// store.
	st, storeDesc, err := openStore(ctx, o.Store, runID, log)
	if err != nil {
		return Summary{}, err
	}
	defer st.close()

	br, brokerDesc, err := openBroker(ctx, o.Broker, runID, log)
	if err != nil {
		return Summary{}, err
	}
	defer br.close()

	rateDesc := "as fast as possible"
	if o.Rate > 0 {
		rateDesc = fmt.Sprintf("%d orders/s", o.Rate)
	}
	fmt.Fprintf(o.Out, "outbox demo: %s → %s\n%d producers, %d relay workers, %d customers, %s for %v\n\n",
		storeDesc, brokerDesc, o.Producers, o.Workers, o.Keys, rateDesc, o.Duration)

	c := &counters{progress: make(chan struct{}, 1)}
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)

	// The consumer.
	consumerDone := make(chan error, 1)
	cons, err := br.consume(runCtx, st, c)
	if err != nil {
		return Summary{}, err
	}
	go func() {
		err := cons.wait()
		if err != nil {
			cancelRun(err) // a failing consumer ends the run
		}
		consumerDone <- err
	}()
	stopConsumer := sync.OnceValue(func() error {
		cons.stop()
		return <-consumerDone
	})
	defer stopConsumer()

	// The relay.
	relay, err := outbox.NewRelay(st.store(), br.publisher(), relayConfig(o, log, c))
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	if err := relay.Start(runCtx); err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	stopRelay := sync.OnceValue(relay.Stop)
	defer stopRelay()

	// Progress.
	start := time.Now()
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		showProgress(o, c, start, stopProgress)
	}()
	endProgress := sync.OnceFunc(func() { close(stopProgress); <-progressDone })
	defer endProgress()

	// The producers.
	produceCtx, stopProducing := context.WithTimeout(runCtx, o.Duration)
	defer stopProducing()
	var limiter *rate.Limiter
	if o.Rate > 0 {
		limiter = newLimiter(o.Rate, o.Producers, time.Now())
	}
	var wg sync.WaitGroup
	for i := range o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			if err := produce(produceCtx, runCtx, st, o.Keys, limiter, rng, c); err != nil {
				cancelRun(err)
			}
		}()
	}

	wg.Wait()
	producing := time.Since(start)
	var runErr error
	if cause := context.Cause(runCtx); cause != nil {
		runErr = cause
	} else if err := waitDrained(runCtx, c, DrainTimeout); err != nil {
		runErr = err
	}

	// Tear down: relay first (it hands back what it holds), then the
	// consumer.
	if err := stopRelay(); err != nil && runErr == nil {
		runErr = fmt.Errorf("demo: stop relay: %w", err)
	}
	if err := stopConsumer(); err != nil && runErr == nil {
		runErr = err
	}
	endProgress()

	sum := c.summary(start)
	// The orders in progress when producing stopped may finish after
	// o.Duration: the rate is over the requested duration, or less if
	// the run was cut short.
	sum.RequestedRate, sum.Producing = o.Rate, min(producing, o.Duration)
	if sum.Producing > 0 {
		sum.OrderRate = float64(sum.Orders) / sum.Producing.Seconds()
	}
	sum.judge()
	fmt.Fprintln(o.Out)
	if err := sum.Print(o.Out); err != nil && runErr == nil {
		runErr = fmt.Errorf("demo: print summary: %w", err)
	}
	if runErr != nil && errors.Is(runErr, context.Canceled) && ctx.Err() != nil {
		runErr = ctx.Err()
	}
	return sum, runErr
}

// catchUp is how far behind the requested rate the producers may fall
// (all of them stalled: waiting for the database, or for the CPU on a busy
// machine) and still make it up afterwards.
const catchUp = 100 * time.Millisecond

// newLimiter returns the producers' limiter: perSecond orders per second,
// starting empty at now, and holding up to catchUp of orders (at least one
// per producer) while the producers cannot take them. Without the catch-up,
// every stall longer than a few orders' time was lost for good, and even
// 100 orders/s fell short on a loaded machine.
func newLimiter(perSecond, producers int, now time.Time) *rate.Limiter {
	burst := max(1, producers, int(time.Duration(perSecond)*catchUp/time.Second))
	l := rate.NewLimiter(rate.Limit(perSecond), burst)
	l.AllowN(now, burst) // start empty: no burst of orders at the start
	return l
}

// waitDrained waits until every written message has been consumed, at most
// timeout.
func waitDrained(ctx context.Context, c *counters, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for c.unique.Load() < c.written.Load() {
		select {
		case <-c.progress:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
			return fmt.Errorf("demo: %d of %d messages still not consumed %v after producing stopped", c.written.Load()-c.unique.Load(), c.written.Load(), timeout)
		}
	}
	return nil
}

func (c *counters) summary(start time.Time) Summary {
	s := Summary{
		Orders:          c.orders.Load(),
		Written:         c.written.Load(),
		Published:       c.published.Load(),
		ConsumedUnique:  c.unique.Load(),
		Duplicates:      c.duplicates.Load(),
		OrderViolations: c.violations.Load(),
		LatencyP50:      c.latency.quantile(0.50),
		LatencyP99:      c.latency.quantile(0.99),
	}
	if last := c.lastAt.Load(); last > 0 {
		s.Elapsed = time.Unix(0, last).Sub(start)
	}
	if s.Elapsed > 0 {
		s.Throughput = float64(s.ConsumedUnique) / s.Elapsed.Seconds()
	}
	return s
}

// showProgress prints the live counters until stop is closed.
func showProgress(o Options, c *counters, start time.Time, stop <-chan struct{}) {
	every := time.Second
	if o.Terminal {
		every = 250 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	line := func() string {
		written, unique := c.written.Load(), c.unique.Load()
		return fmt.Sprintf("%5.1fs  orders %d  written %d  published %d  consumed %d  backlog %d  duplicates %d  order violations %d  p99 so far %v",
			time.Since(start).Seconds(), c.orders.Load(), written, c.published.Load(), unique, max(0, written-unique),
			c.duplicates.Load(), c.violations.Load(), roundLatency(c.latency.quantile(0.99)))
	}
	for {
		select {
		case <-stop:
			if o.Terminal {
				fmt.Fprintf(o.Out, "\r%s\x1b[K\n", line())
			}
			return
		case <-t.C:
			if o.Terminal {
				fmt.Fprintf(o.Out, "\r%s\x1b[K", line())
			} else {
				fmt.Fprintln(o.Out, line())
			}
		}
	}
}

// relayConfig is the demo relay's configuration. The consumer reads a
// customer's events of the three topics as one log and checks their order
// across topics: order scope key. (With the default, topic, each topic is
// ordered alone, and under load the demo saw an order's shipped event
// before its created event and exited 1.)
func relayConfig(o Options, log *slog.Logger, c *counters) outbox.Config {
	return outbox.Config{
		Workers:    o.Workers,
		OrderScope: outbox.OrderScopeKey,
		Logger:     log,
		Hook: func(e outbox.Event) {
			if e.Kind == outbox.EventPublished {
				c.published.Add(int64(e.Count))
			}
		},
	}
}
