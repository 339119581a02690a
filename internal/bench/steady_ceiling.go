package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/store/postgres"
)

// CeilingCommand is the hidden `outbox` subcommand the bench runs as the
// steady-load ceiling's process (`outbox bench steady-ceiling`), see
// RunSteadyCeiling.
var CeilingCommand = []string{"bench", "steady-ceiling"}

// CeilingReady is the one line the ceiling process prints on stdout, once
// it LISTENs: the bench starts its producers after it.
const CeilingReady = "ready"

// SteadyCeilingName is the row of the steady-load ceiling measured right
// after steady/key@RATE, at the same rate: ceiling/steady@RATE.
func SteadyCeilingName(rate int) string { return fmt.Sprintf("ceiling/steady@%d", rate) }

// CeilingSettleEvery is how often the ceiling deletes what it published
// (one DELETE of every ID published since the last), as the relay
// settles every 100 ms; CeilingPollEvery how long it waits for a
// notification before it reads every partition anyway (the safety net
// against a missed one).
const (
	CeilingSettleEvery = 100 * time.Millisecond
	CeilingPollEvery   = 100 * time.Millisecond
)

// ceilingTable is the outbox table in the bench's schema (Env.messages).
const ceilingTable = "outbox_messages"

// CeilingConfig is what the ceiling process runs on: the bench's store
// and destination.
type CeilingConfig struct {
	// DSN is the PostgreSQL URL (OUTBOX_STORE in the process's environment:
	// it may hold a password); Schema holds the outbox table
	// (outbox_messages) with Partitions partitions, whose writes NOTIFY on
	// Channel.
	DSN        string
	Schema     string
	Channel    string
	Partitions int
	// Broker is the broker URL (OUTBOX_BROKER) and SubjectPrefix the
	// bench's destination on it, as `outbox relay` gets them.
	Broker        string
	SubjectPrefix string
	// Ready gets CeilingReady once the process LISTENs.
	Ready io.Writer
}

// Validate names the field to change.
func (c CeilingConfig) Validate() error {
	switch {
	case c.DSN == "":
		return errors.New("bench: steady-ceiling: no store URL: set OUTBOX_STORE")
	case c.Broker == "":
		return errors.New("bench: steady-ceiling: no broker URL: set OUTBOX_BROKER")
	case c.Schema == "":
		return errors.New("bench: steady-ceiling: --schema is required")
	case c.Channel == "":
		return errors.New("bench: steady-ceiling: --channel is required")
	case c.Partitions < 1 || c.Partitions > outbox.MaxPartitions:
		return fmt.Errorf("bench: steady-ceiling: --partitions must be within 1 and %d, got %d", outbox.MaxPartitions, c.Partitions)
	}
	return nil
}

// RunSteadyCeiling is the bare minimum a relay does per producer
// transaction, in one goroutine on one PostgreSQL connection, with no
// leases, no ordering machinery and no metrics server: it LISTENs on the
// outbox's channel; on each notification (with those that arrived
// meanwhile: pgx buffers them), or after CeilingPollEvery without one, it
// reads the pending rows of the notified partitions (every partition after
// the wait) above per-partition cursors in one statement (ceilingFetchSQL),
// publishes them in one Publish call with the broker's confirmations, and
// every CeilingSettleEvery deletes every ID published since the last
// DELETE, in one statement. When ctx ends (SIGTERM) it deletes what it
// published, then sweeps the outbox without cursors until it is empty, and
// returns.
//
// What it skips, being a cost floor and not a relay: per-key order (rows
// of concurrent transactions commit out of seq order: one whose seq is
// below a cursor when it commits is read only after the next DELETE, which
// resets every cursor, and the next wake-up of its partition, so it is
// published late and out of order); retries (a message the broker refused
// fails the process); leases, fencing, dead letters, metrics and a
// backlog bound (a fetch reads everything pending above the cursors).
func RunSteadyCeiling(ctx context.Context, c CeilingConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	// pgxpool's parser: it takes (and drops) the pool_* parameters a bench
	// --store URL may carry.
	cfg, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return fmt.Errorf("bench: steady-ceiling: the store URL is not a valid PostgreSQL URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-bench-ceiling"
	// The plan the store's fetch runs (store/postgres indexedPlan, set per
	// transaction there; once for the session here, at no cost per
	// statement): the pending index whatever the statistics say. Left to
	// choose, on the small, freshly analyzed table of a steady run
	// PostgreSQL cached a plan that took 2.4-3 ms per fetch against 0.15.
	for k, v := range map[string]string{"enable_seqscan": "off", "enable_bitmapscan": "off", "plan_cache_mode": "force_generic_plan"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return fmt.Errorf("bench: steady-ceiling: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pub, err := backends.OpenPublisher(ctx, c.Broker, backends.BrokerOptions{SubjectPrefix: c.SubjectPrefix})
	if err != nil {
		return fmt.Errorf("bench: steady-ceiling: %w", err)
	}
	defer pub.Close()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{c.Channel}.Sanitize()); err != nil {
		return fmt.Errorf("bench: steady-ceiling: listen: %w", err)
	}
	if c.Ready != nil {
		if _, err := fmt.Fprintln(c.Ready, CeilingReady); err != nil {
			return err
		}
	}
	table := pgx.Identifier{c.Schema, ceilingTable}.Sanitize()
	l := &ceilingLoop{
		conn: conn, pub: pub, partitions: c.Partitions,
		fetch:   ceilingFetchSQL(table),
		del:     `DELETE FROM ` + table + ` WHERE id = ANY($1::uuid[])`,
		after:   make(map[int32]int64, c.Partitions),
		settled: time.Now(),
		woke:    time.Now(),
	}
	// Statements run to their end on SIGTERM; only the wait is cut short.
	work := context.WithoutCancel(ctx)
	// What committed before the LISTEN was not announced.
	parts := l.all()
	for ctx.Err() == nil {
		if len(parts) > 0 {
			if _, err := l.fetchPublish(work, parts); err != nil {
				return err
			}
		}
		if len(l.published) > 0 && time.Since(l.settled) >= CeilingSettleEvery {
			if err := l.settle(work); err != nil {
				return err
			}
		}
		if parts, err = l.wait(ctx); err != nil {
			return err
		}
	}
	// The final settle, then the sweep without cursors.
	stop, cancel := context.WithTimeout(work, childStopTimeout/2)
	defer cancel()
	if err := l.settle(stop); err != nil {
		return err
	}
	for {
		clear(l.after)
		n, err := l.fetchPublish(stop, l.all())
		if err != nil {
			return err
		}
		if err := l.settle(stop); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// ceilingLoop is the state of RunSteadyCeiling.
type ceilingLoop struct {
	conn       *pgx.Conn
	pub        outbox.Publisher
	partitions int
	fetch, del string
	// after is the cursor of each partition (the highest seq read since
	// the last DELETE; absent: 0); published the IDs published since the
	// last DELETE, at settled.
	after     map[int32]int64
	published []string
	settled   time.Time
	woke      time.Time
}

func (l *ceilingLoop) all() []int32 {
	out := make([]int32, l.partitions)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

// wait returns the partitions of the next notification and of those
// already received, or every partition after CeilingPollEvery without
// one; it returns early (with none) when a DELETE is due or ctx ends.
func (l *ceilingLoop) wait(ctx context.Context) ([]int32, error) {
	deadline := l.woke.Add(CeilingPollEvery)
	if len(l.published) > 0 {
		deadline = l.settled.Add(CeilingSettleEvery)
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	n, err := l.conn.WaitForNotification(wctx)
	cancel()
	now := time.Now()
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		if wctx.Err() == nil {
			return nil, fmt.Errorf("bench: steady-ceiling: wait for a notification: %w", err)
		}
		if now.Sub(l.woke) >= CeilingPollEvery {
			l.woke = now
			return l.all(), nil // the safety net
		}
		return nil, nil // a DELETE is due
	}
	l.woke = now
	seen := map[int32]bool{}
	var parts []int32
	add := func(payload string) bool {
		ps := parsePartitions(payload)
		if ps == nil {
			return false // "*" or not ours: every partition
		}
		for _, p := range ps {
			if p < l.partitions && !seen[int32(p)] {
				seen[int32(p)] = true
				parts = append(parts, int32(p))
			}
		}
		return true
	}
	every := !add(n.Payload)
	// The notifications that arrived while the last statements ran, which
	// pgx buffered: an expired context returns them, then an error without
	// touching the connection.
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	for {
		m, err := l.conn.WaitForNotification(done)
		if err != nil || m == nil {
			break
		}
		every = !add(m.Payload) || every
	}
	if every {
		return l.all(), nil
	}
	return parts, nil
}

// fetchPublish reads parts' pending rows above their cursors in one
// statement and publishes them in one call, and returns how many.
func (l *ceilingLoop) fetchPublish(ctx context.Context, parts []int32) (int, error) {
	afters := make([]int64, len(parts))
	for i, p := range parts {
		afters[i] = l.after[p]
	}
	// No LIMIT worth the name: at a steady rate a wake-up finds a few rows
	// per partition.
	rows, err := l.conn.Query(ctx, l.fetch, parts, afters, 1<<30)
	if err != nil {
		return 0, fmt.Errorf("bench: steady-ceiling: fetch: %w", err)
	}
	var msgs []*outbox.Message
	for rows.Next() {
		var (
			m       outbox.Message
			part    int32
			seq     int64
			headers *string
		)
		if err := rows.Scan(&m.ID, &part, &seq, &m.Topic, &m.Key, &m.Payload, &headers, &m.CreatedAt); err != nil {
			rows.Close()
			return 0, fmt.Errorf("bench: steady-ceiling: fetch: %w", err)
		}
		if headers != nil && *headers != "{}" && *headers != "null" {
			if err := json.Unmarshal([]byte(*headers), &m.Headers); err != nil {
				rows.Close()
				return 0, fmt.Errorf("bench: steady-ceiling: message %s: headers: %w", m.ID, err)
			}
		}
		msgs = append(msgs, &m)
		l.after[part] = max(l.after[part], seq)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("bench: steady-ceiling: fetch: %w", err)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	errs := l.pub.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		return 0, fmt.Errorf("bench: steady-ceiling: the publisher returned %d results for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("bench: steady-ceiling: publish message %s: %w", msgs[i].ID, err)
		}
		l.published = append(l.published, msgs[i].ID)
	}
	return len(msgs), nil
}

// settle deletes every ID published since the last DELETE and resets the
// cursors: a row committed below a cursor (see RunSteadyCeiling) is read
// on its partition's next wake-up.
func (l *ceilingLoop) settle(ctx context.Context) error {
	l.settled = time.Now()
	if len(l.published) == 0 {
		return nil
	}
	if _, err := l.conn.Exec(ctx, l.del, l.published); err != nil {
		return fmt.Errorf("bench: steady-ceiling: delete: %w", err)
	}
	l.published = l.published[:0]
	clear(l.after)
	return nil
}

// parsePartitions reads a notification's payload, a comma-separated list
// of partition numbers, or returns nil when it is not one ("*": any
// partition). A copy of store/postgres's (unexported), which writes them.
func parsePartitions(payload string) []int {
	if payload == "" {
		return nil
	}
	fields := strings.Split(payload, ",")
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		p, err := strconv.Atoi(f)
		if err != nil || p < 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}

// ceilingProc is the ceiling's process the bench started.
type ceilingProc struct{ *child }

// startCeiling starts `outbox bench steady-ceiling` from the bench's
// binary on the bench's schema and destination (the store and broker URLs
// in its environment, as startRelay gives them to `outbox relay`) and
// waits until it LISTENs.
//
// With Options.RelayProfile set it writes its CPU profile (its whole run,
// warm-up included) to RelayProfile-ceiling-steady-RATE.pprof.
func (e *Env) startCeiling(ctx context.Context, rate int) (*ceilingProc, error) {
	args := append(slices.Clone(CeilingCommand),
		"--schema", e.schema,
		"--channel", postgres.Options{Schema: e.schema}.Channel(),
		"--partitions", strconv.Itoa(e.partitions),
	)
	if e.opts.RelayProfile != "" {
		args = append(args, "--cpuprofile", e.opts.RelayProfile+"-"+strings.NewReplacer("/", "-", "@", "-").Replace(SteadyCeilingName(rate))+".pprof")
	}
	bargs, benv := e.Broker.relayArgs()
	env := append([]string{"OUTBOX_STORE=" + e.DSN}, benv...)
	c, first, err := startChild(ctx, e.opts, "ceiling", append(args, bargs...), env)
	if err != nil {
		return nil, err
	}
	ready, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	select {
	case line, ok := <-first:
		if ok && line == CeilingReady {
			return &ceilingProc{c}, nil
		}
		err := c.stop()
		return nil, fmt.Errorf("bench: the ceiling process did not get ready (it printed %q; %v)%s", line, err, c.lastWords())
	case <-ready.Done():
		_ = c.stop()
		return nil, fmt.Errorf("bench: the ceiling process was not ready within %v%s", readyTimeout, c.lastWords())
	}
}

// steadyCeiling measures the steady-load ceiling at rate: the outbox
// emptied and the destination reset, the ceiling's process started, the
// producers run at rate for warmup+d as in the relay's phase
// (runLoadPhase: every message received, the outbox empty), then the
// process is stopped (SIGTERM: its final settle and sweep) and the run
// checked: nothing left in the outbox, every message once in the stream.
// PostgreSQL's added CPU is against alone, the relay's baseline.
func steadyCeiling(ctx context.Context, env *Env, k Knobs, rate int, warmup, d time.Duration, alone aloneSpan, achievedAlone float64) (*Load, error) {
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		return nil, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return nil, err
	}
	env.meter.setPhase("starting the ceiling")
	proc, err := env.startCeiling(ctx, rate)
	if err != nil {
		return nil, err
	}
	defer func() { _ = proc.stop() }()
	ph, err := runLoadPhase(ctx, env, k, rate, warmup, d, proc.child)
	if err != nil {
		return nil, err
	}
	if err := proc.stop(); err != nil {
		return nil, err
	}
	r := newRun(ph.n, ph.span)
	if r.Left, err = env.leftOurs(ctx); err != nil {
		return nil, err
	}
	if _, err := env.finish(ctx, r); err != nil {
		return nil, err
	}
	l := &Load{Ordering: "-", Rate: float64(rate), PerTx: SteadyPerTx, AchievedAlone: achievedAlone,
		Alone: coreShare(alone.use, alone.span, benchProduces), DeadTuples: -1}
	ph.fill(l, env, alone)
	return l, nil
}
