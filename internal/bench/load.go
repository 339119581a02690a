package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox"
)

// Load is the outcome of a steady/ORDERING@RATE or idle scenario: one
// `outbox relay` process under a fixed offered load (none for idle), with
// the CPU each process used over the measured span.
type Load struct {
	Ordering string `json:"ordering"`
	// Rate is the offered rate (msgs/s, 0 for idle); Achieved what the
	// producers committed with the relay running, AchievedAlone without it.
	Rate          float64 `json:"rate_msgs_per_sec"`
	Achieved      float64 `json:"achieved_msgs_per_sec"`
	AchievedAlone float64 `json:"achieved_alone_msgs_per_sec"`
	PerTx         int     `json:"messages_per_tx"`
	// Seconds is the measured span (after the warm-up); Messages the
	// messages committed in it, whose latencies make the distribution.
	Seconds  float64 `json:"seconds"`
	Messages int     `json:"messages"`
	// P50 … Max are commit→receive latencies in ms: from the producer's
	// Commit returning to the bench's subscriber on the broker receiving
	// the message.
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// Consumer is the JetStream consumer P50 … Max are measured with
	// (Options.SteadyConsumer). RoutedP50 … RoutedMax are commit→routed
	// over the same messages: to a core subscription on the stream's
	// subjects of the same process, which the broker serves as it routes
	// the relay's publish, before the stream stores it and its consumers
	// see it.
	Consumer  string  `json:"consumer"`
	RoutedP50 float64 `json:"routed_p50_ms"`
	RoutedP99 float64 `json:"routed_p99_ms"`
	RoutedMax float64 `json:"routed_max_ms"`
	// Core is each process's CPU over the measured span with the relay
	// running, in percent of one core; Alone the same with the producers
	// alone (no relay). -1: not measured.
	Core  ProcessCPU `json:"cpu_pct_of_core"`
	Alone ProcessCPU `json:"alone_cpu_pct_of_core"`
	// CPU is the CPU time per message with the relay running (µs).
	CPU ProcessCPU `json:"cpu_us_per_msg"`
	// PostgresAddedMicros is the PostgreSQL CPU time per message the relay
	// adds (with the relay minus the producers alone) and
	// PostgresAloneMicros the producers' own (µs per message).
	PostgresAddedMicros float64 `json:"postgres_added_by_relay_us_per_msg"`
	PostgresAloneMicros float64 `json:"postgres_producers_alone_us_per_msg"`
	// RelayStatementsPerSec is the relay's statements per second: every
	// statement's calls with the relay minus those with the producers
	// alone (pg_stat_statements); for idle, every statement. -1: not read.
	RelayStatementsPerSec float64 `json:"relay_statements_per_sec"`
	// Statements are the top statements of the span with the relay.
	Statements []Statement `json:"statements,omitempty"`
	// HeldXmin: one idle transaction holding a transaction ID stayed open
	// through the run with the relay (the horizon/held scenarios).
	HeldXmin bool `json:"held_xmin,omitempty"`
	// DeadTuples is the outbox table's n_dead_tup once every message was
	// received (pg_stat_user_tables; -1: not read), FetchMeanMs and
	// SettleMeanMs the relay's mean fetch and settle times (its metrics).
	DeadTuples   int64   `json:"dead_tuples_at_end"`
	FetchMeanMs  float64 `json:"fetch_mean_ms"`
	SettleMeanMs float64 `json:"settle_mean_ms"`
	// Ceiling is the steady-load ceiling measured right after the relay,
	// at the same rate, against the same producers-alone baseline
	// (ceiling/steady@RATE: RunSteadyCeiling in a process of its own,
	// whose CPU is in Ceiling.CPU.Relay); steady/key@RATE only.
	Ceiling *Load `json:"ceiling,omitempty"`
}

// Steady and idle scenario names.
const (
	IdleName = "idle"
	// SteadyKey1000Name … are steady/ORDERING@RATE: producers at RATE
	// msgs/s in transactions of 10 messages, one `outbox relay` process.
	SteadyKey1000Name  = "steady/key@1000"
	SteadyNone1000Name = "steady/none@1000"
	SteadyKey5000Name  = "steady/key@5000"
	SteadyNone5000Name = "steady/none@5000"
	// HorizonFreeName and HorizonHeldName are steady/key@2000 without
	// and with one idle transaction holding a transaction ID (so the xmin
	// horizon) through the run with the relay: vacuum cannot remove the
	// rows the relay deletes.
	HorizonFreeName = "horizon/free@2000"
	HorizonHeldName = "horizon/held@2000"
	// SteadyPerTx is the messages per producer transaction of the
	// steady/ORDERING@RATE scenarios.
	SteadyPerTx = 10
)

// loadScenarios are the steady/ORDERING@RATE scenarios, in run order.
var loadScenarios = []struct {
	name     string
	ordering outbox.Ordering
	rate     int
	hold     bool // hold the xmin horizon through the run with the relay
	// ceiling: the steady-load ceiling (ceiling/steady@RATE) runs after
	// the relay, at the same rate; steady/none@RATE reads the one of
	// steady/key@RATE (the ceiling has no ordering).
	ceiling bool
}{
	{SteadyKey1000Name, outbox.OrderingKey, 1000, false, true},
	{SteadyNone1000Name, outbox.OrderingNone, 1000, false, false},
	{SteadyKey5000Name, outbox.OrderingKey, 5000, false, true},
	{SteadyNone5000Name, outbox.OrderingNone, 5000, false, false},
	{HorizonFreeName, outbox.OrderingKey, 2000, false, false},
	{HorizonHeldName, outbox.OrderingKey, 2000, true, false},
}

// LoadScenarioNames lists the steady/ORDERING@RATE scenarios and idle.
func LoadScenarioNames() []string {
	names := make([]string, 0, len(loadScenarios)+1)
	for _, s := range loadScenarios {
		names = append(names, s.name)
	}
	return append(names, IdleName)
}

// pct is d as a percentage of one core over span, or -1.
func pct(d time.Duration, span time.Duration) float64 {
	if d < 0 || span <= 0 {
		return -1
	}
	return 100 * d.Seconds() / span.Seconds()
}

// coreShare turns a span's CPU use into percentages of a core.
func coreShare(u cpuUse, span time.Duration, role cpuRole) ProcessCPU {
	p := ProcessCPU{Postgres: pct(u.Server, span), Broker: pct(u.Broker, span), Relay: pct(u.relay(), span), Producers: -1}
	if role == benchProduces {
		p.Producers = pct(u.Client, span)
	}
	return p
}

// loadSpan produces at rate for warmup+d and measures the span after the
// warm-up; with proc set (the relay's or the ceiling's process) its CPU
// counts too. committed, if not nil, gets every transaction's IDs. It
// returns the CPU used, the measured span and the messages committed in
// it.
func loadSpan(ctx context.Context, env *Env, k Knobs, rate int, warmup, d time.Duration, proc *child, committed func([]string, time.Time)) (cpuUse, time.Duration, int, error) {
	use := newCPUMeter(ctx, env)
	if proc != nil {
		use.add(proc)
	}
	var (
		measuring atomic.Bool
		counted   atomic.Int64
		began     time.Time
	)
	count := func(ids []string, t time.Time) {
		if measuring.Load() {
			counted.Add(int64(len(ids)))
		}
		if committed != nil {
			committed(ids, t)
		}
	}
	_, _, err := produce(ctx, env, k, env.writer, rate, SteadyPerTx, warmup, d, func() {
		use.begin()
		began = time.Now()
		measuring.Store(true)
	}, count)
	if err != nil {
		return cpuUse{}, 0, 0, err
	}
	if !measuring.Load() {
		return cpuUse{}, 0, 0, fmt.Errorf("bench: the producers finished within the warm-up")
	}
	u := use.end()
	return u, time.Since(began), int(counted.Load()), nil
}

// aloneSpan is the producers-alone baseline of a steady scenario: the CPU
// used over the measured span and the messages committed in it.
type aloneSpan struct {
	use  cpuUse
	span time.Duration
	n    int
}

// loadPhase is one measured phase of a steady scenario with a process
// relaying (`outbox relay` or the ceiling's): what loadSpan measured, the
// messages of the whole phase (warm-up included) and the commit→receive
// and commit→routed distributions.
type loadPhase struct {
	use         cpuUse
	span        time.Duration
	spanN, n    int
	lat, routed *Latency
}

// runLoadPhase subscribes to the destination (the bench's consumer and,
// where the broker has one, the core subscription), runs the producers at
// rate for warmup+d with proc's CPU counted (loadSpan), and waits until
// every message was received and the outbox is empty; proc exiting before
// then fails it.
func runLoadPhase(ctx context.Context, env *Env, k Knobs, rate int, warmup, d time.Duration, proc *child) (loadPhase, error) {
	perTx, txs, _ := txShape(rate, SteadyPerTx, warmup+d)
	n := perTx * txs
	lat, routed := newLatencies(n), newLatencies(n)
	stop, err := env.Broker.receive(func(id string) { lat.acked([]string{id}, time.Now()) })
	if err != nil {
		return loadPhase{}, err
	}
	defer stop()
	if env.Broker.route != nil {
		stopRoute, err := env.Broker.route(func(id string) { routed.acked([]string{id}, time.Now()) })
		if err != nil {
			return loadPhase{}, err
		}
		defer stopRoute()
	}
	env.meter.start("producing", n)
	from := time.Now().Add(warmup)
	lat.setFrom(from)
	routed.setFrom(from)
	committed := func(ids []string, t time.Time) {
		lat.committed(ids, t)
		routed.committed(ids, t)
	}
	u, span, spanN, err := loadSpan(ctx, env, k, rate, warmup, d, proc, committed)
	if err != nil {
		return loadPhase{}, err
	}
	env.meter.setPhase("draining")
	err = pollUntil(ctx, "steady: wait for every message", func() (bool, int64, error) {
		got := lat.count()
		env.meter.done.Store(got)
		if done, err := proc.exited(); done {
			return false, 0, fmt.Errorf("bench: the %s process exited during the run (%v)%s", proc.name, err, proc.lastWords())
		}
		if got < int64(n) {
			return false, got, nil
		}
		left, err := env.leftOurs(ctx)
		return left == 0, got - left, err
	})
	if err != nil {
		return loadPhase{}, err
	}
	ph := loadPhase{use: u, span: span, spanN: spanN, n: n, lat: lat.summary()}
	if env.Broker.route != nil {
		ph.routed = routed.summary()
	}
	return ph, nil
}

// fill sets l's latencies, rates and CPU from the phase, with alone the
// producers' baseline.
func (ph loadPhase) fill(l *Load, env *Env, alone aloneSpan) {
	u, span := ph.use, ph.span
	l.Messages, l.P50, l.P95, l.P99, l.Max = ph.lat.Messages, ph.lat.P50, ph.lat.P95, ph.lat.P99, ph.lat.Max
	l.Consumer = env.Broker.Consumer
	if r := ph.routed; r != nil {
		l.RoutedP50, l.RoutedP99, l.RoutedMax = r.P50, r.P99, r.Max
	}
	l.Seconds = span.Seconds()
	l.Achieved = float64(ph.spanN) / span.Seconds()
	l.Core = coreShare(u, span, benchProduces)
	msgs := max(1, ph.spanN)
	l.CPU = u.perMessage(msgs, benchProduces)
	l.PostgresAddedMicros, l.PostgresAloneMicros = -1, -1
	if u.Server >= 0 && alone.use.Server >= 0 {
		// Both per second of span, then per message of the steady span.
		perSec := u.Server.Seconds()/span.Seconds() - alone.use.Server.Seconds()/alone.span.Seconds()
		l.PostgresAddedMicros = perSec * 1e6 / l.Achieved
		l.PostgresAloneMicros = alone.use.Server.Seconds() * 1e6 / float64(max(1, alone.n))
	}
	l.RelayStatementsPerSec = -1
	if u.stmts != nil && alone.use.stmts != nil {
		l.RelayStatementsPerSec = float64(u.stmts.calls)/span.Seconds() - float64(alone.use.stmts.calls)/alone.span.Seconds()
		l.Statements = u.stmts.top
		for i := range l.Statements {
			l.Statements[i].MicrosPerMsg = l.Statements[i].TotalMs * 1e3 / float64(msgs)
		}
	}
}

// SteadyLoad runs steady/ORDERING@RATE: first the producers alone (no
// relay) at rate for warmup+d, measured after the warm-up; the outbox is
// emptied; then one `outbox relay` process (ordering, k.Workers, k.Batch)
// is started and waited for, the bench subscribes to its destination, and
// the producers run again for warmup+d. Latency is commit→receive, per
// message committed after the warm-up, once every message was received
// and the outbox is empty.
func SteadyLoad(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering, rate int, warmup, d time.Duration) (*Load, RunResult, error) {
	return steadyLoad(ctx, env, k, ordering, rate, warmup, d, false, false, fmt.Sprintf("steady/%s@%d", ordering, rate))
}

// steadyLoad is SteadyLoad; with hold, one idle transaction holding a
// transaction ID is opened once the relay is ready and stays open until
// every message was received and the dead tuples were read (holdXmin);
// with ceiling, the steady-load ceiling runs after the relay, at the
// same rate, into l.Ceiling (steadyCeiling).
func steadyLoad(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering, rate int, warmup, d time.Duration, hold, ceiling bool, name string) (*Load, RunResult, error) {
	if env.Broker.receive == nil {
		return nil, RunResult{}, fmt.Errorf("bench: the steady scenarios measure commit→receive with a subscriber on the broker, which the bench has for NATS only (--broker %s)", scheme(env.Broker.url))
	}
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		return nil, RunResult{}, err
	}
	env.meter.setPhase("producers alone")
	aloneD := d
	if env.opts.SteadyAloneDuration > 0 {
		aloneD = env.opts.SteadyAloneDuration
	}
	var (
		alone aloneSpan
		err   error
	)
	alone.use, alone.span, alone.n, err = loadSpan(ctx, env, k, rate, warmup, aloneD, nil, nil)
	if err != nil {
		return nil, RunResult{}, err
	}
	l := &Load{Ordering: string(ordering), Rate: float64(rate), PerTx: SteadyPerTx}
	l.AchievedAlone = float64(alone.n) / alone.span.Seconds()
	l.Alone = coreShare(alone.use, alone.span, benchProduces)
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		return nil, RunResult{}, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return nil, RunResult{}, err
	}
	env.meter.setPhase("starting the relay")
	relay, err := env.startRelay(ctx, ordering, k, "bench-steady", env.opts.RelayProfile != "")
	if err != nil {
		return nil, RunResult{}, err
	}
	defer func() { _ = relay.stop() }()
	if err := waitRelayReady(ctx, relay, ordering); err != nil {
		return nil, RunResult{}, err
	}
	l.HeldXmin = hold
	if hold {
		release, err := holdXmin(ctx, env)
		if err != nil {
			return nil, RunResult{}, err
		}
		defer release()
	}
	profiled := env.profileRelay(ctx, relay, warmup, d, name)
	ph, err := runLoadPhase(ctx, env, k, rate, warmup, d, relay.child)
	if err != nil {
		return nil, RunResult{}, err
	}
	if err := profiled(); err != nil {
		return nil, RunResult{}, err
	}
	m, err := relay.scrape(ctx)
	if err != nil {
		return nil, RunResult{}, err
	}
	l.DeadTuples = deadTuples(ctx, env)
	if c := m["outbox_fetch_duration_seconds_count"]; c > 0 {
		l.FetchMeanMs = 1e3 * m["outbox_fetch_duration_seconds_sum"] / c
	}
	if c := m["outbox_settle_duration_seconds_count"]; c > 0 {
		l.SettleMeanMs = 1e3 * m["outbox_settle_duration_seconds_sum"] / c
	}
	if err := relay.stop(); err != nil {
		return nil, RunResult{}, err
	}
	r := newRun(ph.n, ph.span)
	r.Failed = int64(m["outbox_failed_total"])
	r.Relay = relayTimes([]map[string]float64{m})
	if r.Left, err = env.leftOurs(ctx); err != nil {
		return nil, r, err
	}
	if r, err = env.finish(ctx, r); err != nil {
		return nil, r, err
	}
	ph.fill(l, env, alone)
	if ceiling {
		if l.Ceiling, err = steadyCeiling(ctx, env, k, rate, warmup, d, alone, l.AchievedAlone); err != nil {
			return nil, r, fmt.Errorf("%s: %w", SteadyCeilingName(rate), err)
		}
	}
	return l, r, nil
}

// waitRelayReady waits until the relay process serves its metrics and,
// in ordering key, holds leases.
func waitRelayReady(ctx context.Context, relay *relayProc, ordering outbox.Ordering) error {
	ready, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err := pollUntil(ready, "wait for the relay process", func() (bool, int64, error) {
		m, err := relay.scrape(ready)
		if err != nil {
			return false, 0, err
		}
		_, up := m["outbox_fetched_total"] // exported from the start
		if ordering == outbox.OrderingKey {
			return up && m["outbox_leases"] > 0, 0, nil
		}
		return up, 0, nil
	})
	if err != nil {
		return fmt.Errorf("bench: the relay process was not ready within %v: %w", readyTimeout, err)
	}
	return nil
}

// idleSettle is how long the idle scenario lets the relay start before
// it measures.
const idleSettle = 5 * time.Second

// Idle runs one `outbox relay` process (ordering key) on an empty outbox
// for d, from idleSettle after it is ready, and measures its CPU, PostgreSQL's and the
// statements per second (pg_stat_statements: every statement is the
// relay's, nothing else runs).
func Idle(ctx context.Context, env *Env, k Knobs, d time.Duration) (*Load, error) {
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		return nil, err
	}
	relay, err := env.startRelay(ctx, outbox.OrderingKey, k, "bench-idle", false)
	if err != nil {
		return nil, err
	}
	defer func() { _ = relay.stop() }()
	if err := waitRelayReady(ctx, relay, outbox.OrderingKey); err != nil {
		return nil, err
	}
	// Past its start-up: a relay's first lease rounds come every 200 ms
	// (so that relays started together share at once), and its first poll
	// and backlog measure come at once. Idle is what follows.
	select {
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-time.After(idleSettle):
	}
	env.meter.start("idle", int(d.Seconds()))
	use := newCPUMeter(ctx, env)
	use.add(relay.child)
	use.begin()
	began := time.Now()
	select {
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-time.After(d): // the measured span itself
	}
	u := use.end()
	span := time.Since(began)
	if err := relay.stop(); err != nil {
		return nil, err
	}
	l := &Load{Ordering: string(outbox.OrderingKey), Seconds: span.Seconds(), Core: coreShare(u, span, benchWaits),
		CPU: ProcessCPU{Postgres: -1, Broker: -1, Relay: -1, Producers: -1}, PostgresAddedMicros: -1, PostgresAloneMicros: -1, RelayStatementsPerSec: -1}
	if u.stmts != nil {
		l.RelayStatementsPerSec = float64(u.stmts.calls) / span.Seconds()
		l.Statements = u.stmts.top
	}
	return l, nil
}

// runLoad runs a steady/ORDERING@RATE scenario or idle for Run.
func runLoad(ctx context.Context, env *Env, o Options, k Knobs, rep *Report, name string) (*Result, error) {
	res := rep.startOnce(env, name, k)
	var (
		l   *Load
		r   RunResult
		err error
	)
	pprof.Do(ctx, pprof.Labels("scenario", name), func(ctx context.Context) {
		if name == IdleName {
			l, err = Idle(ctx, env, k, o.IdleDuration)
			return
		}
		for _, s := range loadScenarios {
			if s.name == name {
				l, r, err = steadyLoad(ctx, env, k, s.ordering, s.rate, o.SteadyWarmup, o.SteadyDuration, s.hold, s.ceiling, s.name)
			}
		}
	})
	if err == nil {
		err = env.tidy(ctx)
	}
	if err != nil {
		res.Err = err.Error()
		return res, err
	}
	res.Load = l
	if name != IdleName {
		res.once(r, l.Achieved)
	}
	return res, nil
}

// holdXmin opens a transaction on a connection of its own, takes a
// transaction ID and leaves it idle, as a forgotten session of an
// application would: from then on vacuum keeps every row deleted after
// it. release rolls it back.
func holdXmin(ctx context.Context, env *Env) (release func(), err error) {
	conn, err := env.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: hold the xmin horizon: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	}
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("bench: hold the xmin horizon: %w", err)
	}
	return func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		conn.Release()
	}, nil
}

// deadTuples reads the outbox table's dead tuples (n_dead_tup, which
// PostgreSQL's statistics update within a second or so; summed over the
// children of the ring layout: pg_partition_tree lists nothing for a plain
// table), -1 if it cannot.
func deadTuples(ctx context.Context, env *Env) int64 {
	var n int64
	if err := env.Pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE relid = $1::regclass OR relid IN (SELECT relid FROM pg_partition_tree($1::regclass))`, env.messages).Scan(&n); err != nil {
		return -1
	}
	return n
}
