package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/servers"
)

// RelayNone drains a backlog of k.Messages with one `outbox relay` process
// in ordering none (SKIP LOCKED claims), k.Workers workers, batches of
// k.Batch.
func RelayNone(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	return relayDrain(ctx, env, k, outbox.OrderingNone, 1, false)
}

// RelayKey drains a backlog of k.Messages with one `outbox relay` process
// in ordering key (partition leases, per-key order), k.Workers workers,
// batches of k.Batch.
func RelayKey(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	return relayDrain(ctx, env, k, outbox.OrderingKey, 1, false)
}

// Relays returns the relays/N scenario: n `outbox relay` processes
// (ordering key) draining one backlog, timed from the backlog's commit:
// they are started on an empty outbox and waited for until they share
// the partitions evenly (see relaysWarm), so that what N relays cost per
// message is their drain's, not N process start-ups' (a process's start
// — its runtime, connections, first reads — cost about as much CPU as
// draining 10,000 messages, in relays/3 two thirds of the growth from 1
// to 3 relays).
func Relays(n int) ScenarioFunc {
	return func(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
		return relayDrain(ctx, env, k, outbox.OrderingKey, n, true)
	}
}

// relayProc is an `outbox relay` process the bench started, publishing to
// the bench's destination, with its /metrics.
type relayProc struct {
	*child
	metrics string
	base    string // http://127.0.0.1:PORT
}

// httpClient scrapes the relay processes' /metrics.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// startRelay starts `outbox relay` from the bench's binary on the bench's
// schema and destination (the store and broker URLs in its environment,
// OUTBOX_STORE and OUTBOX_BROKER).
func (e *Env) startRelay(ctx context.Context, ordering outbox.Ordering, k Knobs, node string, pprof bool) (*relayProc, error) {
	port, err := servers.FreePort()
	if err != nil {
		return nil, err
	}
	args := []string{"relay",
		"--schema", e.schema,
		"--ordering", string(ordering),
		"--workers", strconv.Itoa(k.Workers), "--batch", strconv.Itoa(k.Batch),
		"--http-addr", "127.0.0.1:" + strconv.Itoa(port),
		"--node", node,
		"--log-level", "warn",
	}
	if pprof {
		args = append(args, "--pprof")
	}
	bargs, benv := e.Broker.relayArgs()
	env := append([]string{"OUTBOX_STORE=" + e.DSN}, benv...)
	c, _, err := startChild(ctx, e.opts, "relay "+node, append(args, bargs...), env)
	if err != nil {
		return nil, err
	}
	return &relayProc{child: c, metrics: "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics", base: "http://127.0.0.1:" + strconv.Itoa(port)}, nil
}

// scrape reads the relay's metrics; an error while its HTTP server is not
// up yet reads as nothing.
func (r *relayProc) scrape(ctx context.Context) (map[string]float64, error) {
	if done, err := r.exited(); done {
		return nil, fmt.Errorf("bench: the %s process exited during the run (%v)%s", r.name, err, r.lastWords())
	}
	m, err := scrapeMetrics(ctx, httpClient, r.metrics)
	if err != nil {
		return map[string]float64{}, nil
	}
	return m, nil
}

// stopRelays stops the relay processes (SIGTERM: a graceful stop) and
// returns the first error.
func stopRelays(relays []*relayProc) error {
	var first error
	for _, r := range relays {
		if err := r.stop(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// relayTimes fills RelayTimes from a relay's metrics (the same events its
// hook sees).
func relayTimes(ms []map[string]float64) *RelayTimes {
	var t RelayTimes
	secs := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	for _, m := range ms {
		t.Fetches += int64(m["outbox_fetch_duration_seconds_count"])
		t.FetchedRecords += int64(m["outbox_fetched_total"])
		t.FetchTime += secs(m["outbox_fetch_duration_seconds_sum"])
		t.Publishes += int64(m["outbox_publish_duration_seconds_count"])
		t.Published += int64(m["outbox_published_total"])
		t.PublishTime += secs(m["outbox_publish_duration_seconds_sum"])
		t.Settles += int64(m["outbox_settle_duration_seconds_count"])
		t.SettleTime += secs(m["outbox_settle_duration_seconds_sum"])
		t.StoreErrors += int64(m["outbox_store_errors_total"])
	}
	return &t
}

// scrapeEvery is how often a drain reads the relays' /metrics while they
// are far from done, and scrapeEveryNear once they published 80% of the
// backlog: each scrape costs the relay some CPU.
const (
	scrapeEvery     = 100 * time.Millisecond
	scrapeEveryNear = 10 * time.Millisecond
)

// relayDrain writes the backlog with the store's Writer, then starts procs
// `outbox relay` processes and times them from their start until the
// outbox is empty (their published counts, from /metrics, reach the
// backlog; then the outbox is counted until it holds nothing); then it
// stops them (SIGTERM, untimed) and checks the stream. With warm, the
// processes start first and the timing starts when the backlog commits
// (relaysWarm).
func relayDrain(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering, procs int, warm bool) (RunResult, error) {
	n := k.Messages
	var (
		relays  []*relayProc
		cpu     *cpuMeter
		untimed func()
		start   time.Time
		err     error
	)
	defer func() { _ = stopRelays(relays) }()
	if warm {
		relays, cpu, untimed, start, err = relaysWarm(ctx, env, k, ordering, procs)
		if err != nil {
			return RunResult{}, err
		}
	} else {
		if err := env.prepareOurs(ctx, k, n); err != nil {
			return RunResult{}, err
		}
		if err := env.Broker.Reset(ctx); err != nil {
			return RunResult{}, err
		}
		cpu = newCPUMeter(ctx, env)
		_, untimed = timed(ctx)
		cpu.begin()
		start = time.Now()
		for i := range procs {
			r, err := env.startRelay(ctx, ordering, k, "bench-relay-"+strconv.Itoa(i+1), false)
			if err != nil {
				untimed()
				return RunResult{}, err
			}
			relays = append(relays, r)
			cpu.add(r.child)
		}
	}
	var (
		last      time.Time
		published int64
		metrics   = make([]map[string]float64, procs)
	)
	err = pollUntil(ctx, fmt.Sprintf("%d relay process(es), ordering %s", procs, ordering), func() (bool, int64, error) {
		if published < int64(n) {
			every := scrapeEvery
			if published >= int64(n)*8/10 {
				every = scrapeEveryNear
			}
			if time.Since(last) < every {
				return false, published, nil
			}
			last = time.Now()
			var sum float64
			for i, r := range relays {
				m, err := r.scrape(ctx)
				if err != nil {
					return false, 0, err
				}
				if d := m["outbox_dead_lettered_total"]; d > 0 {
					return false, 0, fmt.Errorf("bench: %s dead-lettered %.0f messages%s", r.name, d, r.lastWords())
				}
				metrics[i] = m
				sum += m["outbox_published_total"]
			}
			published = int64(sum)
			env.meter.done.Store(published)
			if published < int64(n) {
				return false, published, nil
			}
		}
		left, err := env.leftOurs(ctx)
		return left == 0, published - left, err
	})
	elapsed := time.Since(start)
	cpuUsed := cpu.end()
	untimed()
	if err != nil {
		return RunResult{}, err
	}
	r := newRun(n, elapsed)
	var failed float64
	for i, rp := range relays {
		// A relay started last on a loaded machine may not be up yet when
		// the others have drained everything: a SIGTERM before it handles
		// signals would end it with "signal: terminated".
		if err := waitServing(ctx, rp); err != nil {
			return r, err
		}
		m, err := rp.scrape(ctx)
		if err != nil {
			return r, err
		}
		metrics[i] = m
		failed += m["outbox_failed_total"]
	}
	r.Failed = int64(failed)
	r.Relay = relayTimes(metrics)
	if procs > 1 && r.Relay.Published > 0 {
		for _, m := range metrics {
			r.RelayShares = append(r.RelayShares, m["outbox_published_total"]/float64(r.Relay.Published))
		}
	}
	err = stopRelays(relays)
	relays = nil
	if err != nil {
		return r, err
	}
	r.setCPU(cpuUsed, benchWaits)
	if r.Left, err = env.leftOurs(ctx); err != nil {
		return r, err
	}
	return env.finish(ctx, r)
}

// relaysWarm starts procs `outbox relay` processes (ordering key) on an
// empty outbox, waits until each serves its metrics and they hold the
// partitions evenly (all of them held, none over its fair share), then writes k.Messages in one transaction and begins the timing
// (CPU, statements, the clock) just before its commit: the relays see
// none of it before, and drain it from there as relays that were running
// when it came. Without vacuum or analyze of the backlog, unlike the cold
// drains: the running relays see the table as written.
func relaysWarm(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering, procs int) (relays []*relayProc, cpu *cpuMeter, untimed func(), start time.Time, err error) {
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	env.meter.setPhase("starting the relays")
	for i := range procs {
		r, err := env.startRelay(ctx, ordering, k, "bench-relay-"+strconv.Itoa(i+1), false)
		if err != nil {
			return relays, nil, nil, time.Time{}, err
		}
		relays = append(relays, r)
	}
	if err := waitBalanced(ctx, env, relays); err != nil {
		return relays, nil, nil, time.Time{}, err
	}
	env.meter.start("writing", k.Messages)
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		return relays, nil, nil, time.Time{}, fmt.Errorf("bench: write the backlog: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after the commit: nothing
	msgs := make([]outbox.Message, 0, writeChunk)
	for i := 0; i < k.Messages; i += writeChunk {
		msgs = msgs[:0]
		for j := i; j < min(k.Messages, i+writeChunk); j++ {
			msgs = append(msgs, env.message(k, j))
		}
		if err := env.writer.Write(ctx, tx, msgs...); err != nil {
			return relays, nil, nil, time.Time{}, fmt.Errorf("bench: write the backlog: %w", err)
		}
		env.meter.done.Add(int64(len(msgs)))
	}
	cpu = newCPUMeter(ctx, env)
	cpu.add(childrenOf(relays)...)
	env.meter.setPhase("running")
	env.meter.done.Store(0)
	_, untimed = timed(ctx)
	cpu.begin()
	start = time.Now()
	if err := tx.Commit(ctx); err != nil {
		untimed()
		return relays, nil, nil, time.Time{}, fmt.Errorf("bench: commit the backlog: %w", err)
	}
	return relays, cpu, untimed, start, nil
}

// childrenOf returns the relays' processes.
func childrenOf(relays []*relayProc) []*child {
	out := make([]*child, len(relays))
	for i, r := range relays {
		out[i] = r.child
	}
	return out
}

// waitBalanced waits until every relay serves its metrics and the relays
// hold every partition, none more than its fair share (the partitions
// over the relays, rounded up).
func waitBalanced(ctx context.Context, env *Env, relays []*relayProc) error {
	ready, cancel := context.WithTimeout(ctx, balanceTimeout)
	defer cancel()
	// The relays' own fair share: none takes more (coordinator.go), so all
	// partitions held and none over it is where they stay.
	share := (env.partitions + len(relays) - 1) / len(relays)
	var held []float64
	err := pollUntil(ready, "wait for the relays to share the partitions", func() (bool, int64, error) {
		held = held[:0]
		total, moved := 0.0, 0.0
		even := true
		for i, r := range relays {
			m, err := r.scrape(ready)
			if err != nil {
				return false, 0, err
			}
			if _, up := m["outbox_fetched_total"]; !up {
				return false, 0, nil
			}
			l := m["outbox_leases"]
			held = append(held, l)
			total += l
			moved += float64(i+1) * l // changes as leases move
			even = even && l <= float64(share)
		}
		return even && int(total) == env.partitions, int64(total*1e6 + moved), nil
	})
	if err != nil {
		return fmt.Errorf("bench: %d relay processes did not share the %d partitions (at most %d each) within %v (leases held: %v): %w", len(relays), env.partitions, share, balanceTimeout, held, err)
	}
	return nil
}

// balanceTimeout bounds the wait for relays to share the partitions: a
// few heartbeats (each relay takes its share as it sees the others).
const balanceTimeout = 2 * time.Minute

// Scaling returns the scaling scenario with w workers: relay/key on the
// given backlog (the ADR's runs used 10,000 events).
func Scaling(w, messages int) ScenarioFunc {
	return func(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
		k.Workers = w
		k.Messages = messages
		return RelayKey(ctx, env, k)
	}
}

// profileRelay, with Options.RelayProfile set, takes a CPU profile of the
// relay process (started with --pprof) over the measured span, from
// warmup on for d, and writes it to RelayProfile-NAME.pprof; the returned
// function waits for it. Without RelayProfile it does nothing.
func (e *Env) profileRelay(ctx context.Context, relay *relayProc, warmup, d time.Duration, name string) (wait func() error) {
	if e.opts.RelayProfile == "" {
		return func() error { return nil }
	}
	file := e.opts.RelayProfile + "-" + strings.NewReplacer("/", "-", "@", "-").Replace(name) + ".pprof"
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(warmup):
			}
			secs := max(1, int(d.Round(time.Second)/time.Second))
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, relay.base+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
			if err != nil {
				return err
			}
			resp, err := (&http.Client{Timeout: time.Duration(secs)*time.Second + time.Minute}).Do(req)
			if err != nil {
				return fmt.Errorf("bench: profile the relay: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("bench: profile the relay: %s", resp.Status)
			}
			f, err := os.Create(file)
			if err != nil {
				return fmt.Errorf("bench: profile the relay: %w", err)
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				_ = f.Close()
				return fmt.Errorf("bench: profile the relay: %w", err)
			}
			return f.Close()
		}()
	}()
	return func() error { return <-done }
}

// waitServing waits until the relay process serves its metrics (its
// signal handling is in place by then).
func waitServing(ctx context.Context, relay *relayProc) error {
	ready, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err := pollUntil(ready, "wait for the relay process", func() (bool, int64, error) {
		m, err := relay.scrape(ready)
		_, up := m["outbox_fetched_total"] // exported from the start
		return up, 0, err
	})
	if err != nil {
		return fmt.Errorf("bench: the %s process did not serve its metrics within %v: %w%s", relay.name, readyTimeout, err, relay.lastWords())
	}
	return nil
}
