package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Knobs are the workload of one scenario run.
type Knobs struct {
	// Messages is the backlog to drain (or the messages to publish).
	Messages int
	// Payload is the payload size in bytes.
	Payload int
	// Keys is how many keys the messages are spread over, round-robin.
	Keys int
	// Batch and Workers configure our relay (the seeds use their own).
	Batch   int
	Workers int
}

// RunResult is the outcome of one scenario run.
type RunResult struct {
	Messages   int           `json:"messages"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	MsgsPerSec float64       `json:"msgs_per_sec"`
	// Stored is how many messages the broker's stream holds after the run
	// (-1: the broker cannot tell, or no broker was involved).
	Stored int64 `json:"stored"`
	// Left is how many messages the outbox holds after the run (-1: no
	// outbox was involved).
	Left int64 `json:"left"`
	// Failed counts failed publish attempts (retried by our relay; the
	// seeds record the error and move on, losing the message).
	Failed int64 `json:"failed"`
	// Relay is where our relay spent its time (relay scenarios only).
	Relay *RelayTimes `json:"relay,omitempty"`
	// TxPerSec is the transactions committed per second (writer
	// scenarios).
	TxPerSec float64 `json:"tx_per_sec,omitempty"`
	// ClientCPUMicros and ServerCPUMicros are the CPU time per message of
	// the bench's process (producers or relay, and an embedded broker) and
	// of the PostgreSQL server (-1: not on this machine), where measured.
	ClientCPUMicros float64 `json:"client_cpu_us_per_msg,omitempty"`
	ServerCPUMicros float64 `json:"server_cpu_us_per_msg,omitempty"`
	// CPU is the CPU time per message of each process, where measured.
	CPU *ProcessCPU `json:"cpu_us_per_msg,omitempty"`
	// Statements are the top statements of the timed span by total time
	// (pg_stat_statements, on the bench's own server), and StatementCalls
	// every statement's calls together.
	Statements     []Statement `json:"statements,omitempty"`
	StatementCalls int64       `json:"statement_calls,omitempty"`
	// RelayShares holds, for relays/N, each relay process's share of the
	// messages published (from its /metrics).
	RelayShares []float64 `json:"relay_shares,omitempty"`
}

func newRun(n int, elapsed time.Duration) RunResult {
	return RunResult{Messages: n, Elapsed: elapsed, MsgsPerSec: float64(n) / elapsed.Seconds(), Stored: -1, Left: -1}
}

// check fails a run that lost messages or left some behind.
func (r RunResult) check() error {
	if r.Left > 0 {
		return fmt.Errorf("the outbox still holds %d of %d messages after the run", r.Left, r.Messages)
	}
	if r.Stored >= 0 && r.Stored != int64(r.Messages) {
		return fmt.Errorf("the broker's stream holds %d messages, want %d: messages were lost or duplicated", r.Stored, r.Messages)
	}
	return nil
}

// ScenarioFunc runs one scenario once.
type ScenarioFunc func(ctx context.Context, env *Env, k Knobs) (RunResult, error)

// Env is what the scenarios run against: one PostgreSQL database, in which
// the bench keeps three schemas of its own (ours, the naive seed's and the
// tuned seed's), and one broker.
type Env struct {
	// DSN is the database's URL.
	DSN string
	// Pool is the bench's connection pool on DSN, large enough for every
	// scenario's workers at once.
	Pool *pgxpool.Pool
	// Broker is the publisher factory, with the stream checks.
	Broker *Broker
	// Log receives the relay's logs.
	Log *slog.Logger

	schema      string // our outbox's schema (unquoted)
	naiveSchema string
	tunedSchema string

	messages, deadLetters, relays, leases string // ours, quoted and qualified
	writer                                *postgres.Writer
	partitions                            int

	payloadMu sync.Mutex
	payloads  [][]byte
	payload   int // size of payloads

	meter meter

	// opts are the bench's options (for the processes it starts).
	opts Options
	// db says what the database is: DBDurable, DBFast or DBExternal.
	db string
	// statements is set when pg_stat_statements is read per run.
	statements bool

	postmasterOnce sync.Once
	postmasterPID  int
}

// meter is the progress of the run in progress.
type meter struct {
	done  atomic.Int64
	total atomic.Int64
	phase atomic.Pointer[string]

	mu            sync.Mutex
	name          string
	round, rounds int
	since         time.Time
}

// scenario records the scenario run that starts now.
func (m *meter) scenario(name string, round, rounds int) {
	m.mu.Lock()
	m.name, m.round, m.rounds, m.since = name, round, rounds, time.Now()
	m.mu.Unlock()
}

func (m *meter) start(phase string, total int) {
	m.done.Store(0)
	m.total.Store(int64(total))
	m.phase.Store(&phase)
}

func (m *meter) setPhase(phase string) { m.phase.Store(&phase) }

// progress returns the progress of the run in progress, if any.
func (m *meter) progress() (Progress, bool) {
	m.mu.Lock()
	p := Progress{Scenario: m.name, Round: m.round, Rounds: m.rounds, Elapsed: time.Since(m.since)}
	m.mu.Unlock()
	p.Done, p.Total = m.done.Load(), m.total.Load()
	if ph := m.phase.Load(); ph != nil {
		p.Phase = *ph
	}
	return p, p.Scenario != ""
}

// poolConnsMin is the smallest connection pool the bench opens: the
// steady scenario's producers plus relay workers, claims and listeners.
const poolConnsMin = 32

// NewEnv connects to dsn and creates the bench's schemas (named
// outbox_bench_<random>, outbox_bench_<random>_naive and …_tuned): our
// outbox tables, migrated, and the seeds' table outbox_messages, with the
// article's covering index in the tuned schema. Close drops them.
// The pool holds poolConnsMin + 2 × workers connections, unless dsn sets
// pool_max_conns.
func NewEnv(ctx context.Context, dsn string, broker *Broker, workers int, log *slog.Logger) (*Env, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: the store URL is not a valid PostgreSQL URL: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = int32(poolConnsMin + 2*max(workers, SeedTunedWorkers, slices.Max(ScalingWorkers)))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("bench: connect to PostgreSQL at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !log.Enabled(ctx, slog.LevelDebug) {
		// A relay starts per run: its info logs (leases taken) would
		// drown the output. Warnings and errors still show.
		log = slog.New(minLevel{log.Handler(), slog.LevelWarn})
	}
	base := "outbox_bench_" + randomHex(4)
	e := &Env{
		DSN: dsn, Pool: pool, Broker: broker, Log: log,
		schema: base, naiveSchema: base + "_naive", tunedSchema: base + "_tuned",
	}
	q := func(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }
	e.messages, e.deadLetters, e.relays, e.leases = q("outbox_messages"), q("outbox_dead_letters"), q("outbox_relays"), q("outbox_leases")
	if err := e.create(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Env) create(ctx context.Context) error {
	st, err := postgres.New(e.Pool, postgres.Options{Schema: e.schema})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if e.partitions, err = st.Partitions(ctx); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if e.writer, err = postgres.NewWriter(postgres.Options{Schema: e.schema}); err != nil {
		return err
	}
	for _, s := range []string{e.naiveSchema, e.tunedSchema} {
		if _, err := e.Pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{s}.Sanitize()); err != nil {
			return fmt.Errorf("bench: create schema %s: %w", s, err)
		}
		if _, err := e.Pool.Exec(ctx, seedTableSQL(seedTable(s))); err != nil {
			return fmt.Errorf("bench: create the seed table in %s: %w", s, err)
		}
	}
	if _, err := e.Pool.Exec(ctx, seedIndexSQL(e.tunedSchema)); err != nil {
		return fmt.Errorf("bench: create the seed's covering index: %w", err)
	}
	return nil
}

// Close drops the bench's schemas and closes the pool.
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range []string{e.schema, e.naiveSchema, e.tunedSchema} {
		if _, err := e.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`); err != nil {
			e.Log.Warn("bench: drop schema", "schema", s, "err", err)
		}
	}
	e.Pool.Close()
}

// Schema returns the schema of our outbox tables.
func (e *Env) Schema() string { return e.schema }

// openStore returns a store for our schema on the bench's pool.
func (e *Env) openStore() (*postgres.Store, error) {
	return postgres.New(e.Pool, postgres.Options{Schema: e.schema})
}

// payloadFor returns the payload of message i: one of 256 random JSON
// documents of k.Payload bytes, {"p":"<hex>"}. Random hex does not
// compress, so the seed's covering index meets its row limit for real.
func (e *Env) payloadFor(k Knobs, i int) []byte {
	e.payloadMu.Lock()
	defer e.payloadMu.Unlock()
	if e.payload != k.Payload || e.payloads == nil {
		e.payloads = make([][]byte, 256)
		for j := range e.payloads {
			e.payloads[j] = makePayload(k.Payload)
		}
		e.payload = k.Payload
	}
	return e.payloads[i%len(e.payloads)]
}

func makePayload(size int) []byte {
	pad := max(0, size-len(`{"p":""}`))
	raw := make([]byte, (pad+1)/2)
	_, _ = rand.Read(raw)
	h := hex.EncodeToString(raw)[:pad]
	return []byte(`{"p":"` + h + `"}`)
}

// message returns message i of a workload (without ID: Write assigns one).
func (e *Env) message(k Knobs, i int) outbox.Message {
	return outbox.Message{Topic: Topic, Key: "key-" + strconv.Itoa(i%k.Keys), Payload: e.payloadFor(k, i)}
}

// writeChunk is how many messages one backlog statement (and transaction)
// writes.
const writeChunk = 10_000

// prepareOurs empties our outbox and writes a backlog of n messages with
// the store's Writer in big transactions (one multi-row statement each),
// then vacuums and analyzes the table, so that every run starts alike.
func (e *Env) prepareOurs(ctx context.Context, k Knobs, n int) error {
	e.meter.start("writing", n)
	if _, err := e.Pool.Exec(ctx, `TRUNCATE `+e.messages+`, `+e.deadLetters+`, `+e.relays); err != nil {
		return fmt.Errorf("bench: empty the outbox: %w", err)
	}
	if _, err := e.Pool.Exec(ctx, `UPDATE `+e.leases+` SET owner = NULL, expires_at = NULL`); err != nil {
		return fmt.Errorf("bench: free the leases: %w", err)
	}
	msgs := make([]outbox.Message, 0, writeChunk)
	for i := 0; i < n; i += writeChunk {
		msgs = msgs[:0]
		for j := i; j < min(n, i+writeChunk); j++ {
			msgs = append(msgs, e.message(k, j))
		}
		err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return e.writer.Write(ctx, tx, msgs...) })
		if err != nil {
			return fmt.Errorf("bench: write the backlog: %w", err)
		}
		e.meter.done.Add(int64(len(msgs)))
	}
	return e.settle(ctx, e.messages)
}

// settle vacuums and analyzes a freshly written table and checkpoints, so
// that no run inherits another's dead rows or dirty buffers.
func (e *Env) settle(ctx context.Context, table string) error {
	if _, err := e.Pool.Exec(ctx, `VACUUM (ANALYZE) `+table); err != nil {
		return fmt.Errorf("bench: vacuum %s: %w", table, err)
	}
	// Needs superuser or pg_checkpoint; without it, runs just share the
	// server's own checkpoint schedule.
	_, _ = e.Pool.Exec(ctx, `CHECKPOINT`)
	e.meter.setPhase("running")
	e.meter.done.Store(0)
	return nil
}

// tidy empties every table the scenarios write, after a run and its
// checks. A drained table holds a run's worth of dead rows (deleted by our
// relay, updated by the seeds), which autovacuum would otherwise clean up
// during some later run, competing with it for the same CPUs: relay/key
// measured 57-71k msgs/s after the seeds' runs and 65-80k without them.
func (e *Env) tidy(ctx context.Context) error {
	_, err := e.Pool.Exec(ctx, `TRUNCATE `+strings.Join([]string{
		e.messages, e.deadLetters, e.relays, seedTable(e.naiveSchema), seedTable(e.tunedSchema),
	}, ", "))
	if err != nil {
		return fmt.Errorf("bench: empty the tables after a run: %w", err)
	}
	return nil
}

// leftOurs counts the unpublished messages of our outbox.
func (e *Env) leftOurs(ctx context.Context) (int64, error) {
	var n int64
	err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+e.messages+` WHERE published_at IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("bench: count the outbox: %w", err)
	}
	return n, nil
}

// finish fills in what the broker stored and checks the run.
func (e *Env) finish(ctx context.Context, r RunResult) (RunResult, error) {
	e.meter.setPhase("checking")
	stored, err := e.Broker.Stored(ctx)
	if err != nil {
		return r, err
	}
	r.Stored = stored
	return r, r.check()
}

// stallTimeout fails a run that makes no progress for this long.
const stallTimeout = time.Minute

// pollInterval is how often a drain checks whether it is done.
const pollInterval = 5 * time.Millisecond

// pollUntil calls step every pollInterval until it reports done or an
// error, ctx ends, or the progress it reports stays the same for
// stallTimeout.
func pollUntil(ctx context.Context, what string, step func() (done bool, progress int64, err error)) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	last, changed := int64(-1), time.Now()
	for {
		done, p, err := step()
		if err != nil || done {
			return err
		}
		if p != last {
			last, changed = p, time.Now()
		} else if time.Since(changed) > stallTimeout {
			return fmt.Errorf("bench: %s: no progress for %v (stuck at %d)", what, stallTimeout, p)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// minLevel drops the records of its handler below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// timed labels the calling goroutine, and the goroutines it starts from
// now on, with phase=timed for CPU profiles (go tool pprof
// -tagfocus=phase=timed); the returned function labels it phase=untimed
// again. The runner labels each scenario run with scenario=<name>.
func timed(ctx context.Context) (context.Context, func()) {
	tctx := pprof.WithLabels(ctx, pprof.Labels("phase", "timed"))
	pprof.SetGoroutineLabels(tctx)
	return tctx, func() { pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("phase", "untimed"))) }
}
