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
	return relayDrain(ctx, env, k, outbox.OrderingNone, 1)
}

// RelayKey drains a backlog of k.Messages with one `outbox relay` process
// in ordering key (partition leases, per-key order), k.Workers workers,
// batches of k.Batch.
func RelayKey(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	return relayDrain(ctx, env, k, outbox.OrderingKey, 1)
}

// Relays returns the relays/N scenario: n `outbox relay` processes
// (ordering key), started together, draining one backlog.
func Relays(n int) ScenarioFunc {
	return func(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
		return relayDrain(ctx, env, k, outbox.OrderingKey, n)
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
// stops them (SIGTERM, untimed) and checks the stream.
func relayDrain(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering, procs int) (RunResult, error) {
	n := k.Messages
	if err := env.prepareOurs(ctx, k, n); err != nil {
		return RunResult{}, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	cpu := newCPUMeter(ctx, env)
	_, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	var relays []*relayProc
	defer func() { _ = stopRelays(relays) }()
	for i := range procs {
		r, err := env.startRelay(ctx, ordering, k, "bench-relay-"+strconv.Itoa(i+1), false)
		if err != nil {
			untimed()
			return RunResult{}, err
		}
		relays = append(relays, r)
		cpu.add(r.child)
	}
	var (
		last      time.Time
		published int64
		metrics   = make([]map[string]float64, procs)
	)
	err := pollUntil(ctx, fmt.Sprintf("%d relay process(es), ordering %s", procs, ordering), func() (bool, int64, error) {
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
