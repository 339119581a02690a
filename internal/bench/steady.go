package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Latency is the outcome of the steady scenario: commit→broker-ack latency
// of every message produced at a fixed rate while relay/key runs.
type Latency struct {
	// Rate is the target rate (msgs/s); Achieved what the producers wrote
	// (lower if PostgreSQL could not keep up).
	Rate     float64 `json:"rate_msgs_per_sec"`
	Achieved float64 `json:"achieved_msgs_per_sec"`
	// PerTx is the messages per producer transaction.
	PerTx int `json:"messages_per_tx"`
	// Seconds is the measured time, after the warm-up; Messages the
	// messages committed in it, whose latencies make the distribution.
	Seconds  float64 `json:"seconds"`
	Messages int     `json:"messages"`
	// WarmupSeconds and WarmupMessages are the warm-up before it: those
	// messages were relayed and checked but are not in the distribution.
	WarmupSeconds  float64 `json:"warmup_seconds"`
	WarmupMessages int     `json:"warmup_messages"`
	// CPUBusy is the share of the machine's CPU time (all cores, every
	// process) that was not idle during the measured time, in percent;
	// -1 where the system does not tell (it is read from /proc/stat).
	CPUBusy float64 `json:"cpu_busy_pct"`
	// CPUs is the number of CPUs CPUBusy is a share of.
	CPUs int `json:"cpus"`
	// ClientCPUMicros and ServerCPUMicros are the CPU time per message
	// over the measured time: the bench's process (producers, relay, an
	// embedded broker) and PostgreSQL's processes (-1: not on this
	// machine).
	ClientCPUMicros float64 `json:"client_cpu_us_per_msg"`
	ServerCPUMicros float64 `json:"server_cpu_us_per_msg"`
	P50             float64 `json:"p50_ms"`
	P95             float64 `json:"p95_ms"`
	P99             float64 `json:"p99_ms"`
	Max             float64 `json:"max_ms"`
}

// readyTimeout bounds the wait for a relay to become ready.
const readyTimeout = 30 * time.Second

// SteadyWAL runs relay/wal (k.Workers, k.Batch, in the bench's process)
// on the bench's slot (created for the run, dropped after it) while
// SteadyProducers goroutines emit rate messages per second into the WAL
// for warmup and then d (see produce). It records, per message, the time
// its transaction's Commit returned and the time the relay's Publish call
// carrying it returned with no error for it (a wrapping publisher), and
// returns the distribution of the difference over every message committed
// after the warm-up, once all messages are acknowledged and nothing is
// buffered. It also reads how busy the machine's CPUs were after the
// warm-up, while producing.
func SteadyWAL(ctx context.Context, env *Env, k Knobs, rate int, warmup, d time.Duration) (*Latency, RunResult, error) {
	return steadyWAL(ctx, env, k, rate, warmup, d, false)
}

// HorizonWALFreeName and HorizonWALHeldName are steady/wal at 2,000
// msgs/s without and with one idle transaction holding a transaction ID
// through the run (opened once the relay is ready: creating the slot
// waits for the transactions in progress).
const (
	HorizonWALFreeName = "horizon/wal-free@2000"
	HorizonWALHeldName = "horizon/wal-held@2000"
	horizonRate        = 2000
)

// steadyWAL is SteadyWAL; with hold, see holdXmin.
func steadyWAL(ctx context.Context, env *Env, k Knobs, rate int, warmup, d time.Duration, hold bool) (*Latency, RunResult, error) {
	if rate <= 0 {
		return nil, RunResult{}, fmt.Errorf("bench: steady: rate must be positive, got %d", rate)
	}
	perTx, txs, _ := txShape(rate, 0, warmup+d)
	n := txs * perTx
	k0 := k
	k0.Messages = 0
	ws, cleanup, err := env.prepareWAL(ctx, k0)
	if err != nil {
		return nil, RunResult{}, err
	}
	defer cleanup()
	store, writer := ws, ws.Writer()
	left := func() (int64, error) { return int64(ws.Stats().Buffered), nil }
	env.meter.start("starting", n)
	if err := env.Broker.Reset(ctx); err != nil {
		return nil, RunResult{}, err
	}
	inner, err := env.Broker.NewPublisher(ctx)
	if err != nil {
		return nil, RunResult{}, err
	}
	defer inner.Close()
	lat := newLatencies(n)
	pub := &ackRecorder{Publisher: inner, lat: lat}
	var clock relayClock
	relay, err := outbox.NewRelay(store, pub, outbox.Config{
		Ordering:  outbox.OrderingKey,
		Workers:   k.Workers,
		BatchSize: k.Batch,
		Logger:    env.Log,
		Hook:      clock.hook,
	})
	if err != nil {
		return nil, RunResult{}, err
	}
	if err := relay.Start(ctx); err != nil {
		return nil, RunResult{}, err
	}
	defer relay.Stop() //nolint:errcheck // stopped (and checked) below; a no-op then
	ready, cancel := context.WithTimeout(ctx, readyTimeout)
	err = pollUntil(ready, "steady: wait for the relay", func() (bool, int64, error) { return relay.Ready() && relay.Stats().Leases > 0, 0, nil })
	cancel()
	if err != nil {
		return nil, RunResult{}, fmt.Errorf("bench: steady: the relay was not ready within %v: %w", readyTimeout, err)
	}
	if hold {
		release, err := holdXmin(ctx, env)
		if err != nil {
			return nil, RunResult{}, err
		}
		defer release()
	}

	env.meter.setPhase("producing")
	cpu := &cpuWindow{}
	use := newCPUMeter(ctx, env)
	lat.setFrom(time.Now().Add(warmup))
	_, produced, err := produce(ctx, env, k, writer, rate, 0, warmup, d, func() { cpu.begin(); use.begin() }, lat.committed)
	if err != nil {
		return nil, RunResult{}, err
	}
	busy := cpu.end()
	used := use.end()
	env.meter.setPhase("draining")
	err = pollUntil(ctx, "steady: wait for the acknowledgements", func() (bool, int64, error) {
		acked := lat.count()
		env.meter.done.Store(acked)
		if acked < int64(n) {
			return false, acked, nil
		}
		left, err := left()
		return left == 0, acked - left, err
	})
	if err != nil {
		return nil, RunResult{}, err
	}
	if err := relay.Stop(); err != nil {
		return nil, RunResult{}, fmt.Errorf("bench: stop the relay: %w", err)
	}
	r := newRun(n, produced)
	r.Failed = relay.Stats().Failed
	r.Relay = clock.times()
	if r.Left, err = left(); err != nil {
		return nil, r, err
	}
	if r, err = env.finish(ctx, r); err != nil {
		return nil, r, err
	}
	l := lat.summary()
	l.Rate = float64(rate)
	l.Achieved = float64(n) / produced.Seconds()
	l.PerTx = perTx
	l.WarmupSeconds = min(warmup, produced).Seconds()
	l.Seconds = produced.Seconds() - l.WarmupSeconds
	l.CPUBusy = busy
	l.CPUs = runtime.NumCPU()
	if measured := max(1, n*int(d)/int(warmup+d)); warmup+d > 0 {
		// The messages produced in the measured time, by the schedule.
		l.ClientCPUMicros = float64(used.Client.Microseconds()) / float64(measured)
		l.ServerCPUMicros = -1
		if used.Server >= 0 {
			l.ServerCPUMicros = float64(used.Server.Microseconds()) / float64(measured)
		}
	}
	return l, r, nil
}

// txShape returns the messages per producer transaction at rate (perTx,
// or with 0 the fewest that keep the transactions at SteadyTxRateMax per
// second at most), the transactions of span and their interval.
func txShape(rate, perTx int, span time.Duration) (_, txs int, interval time.Duration) {
	if perTx <= 0 {
		perTx = (rate + SteadyTxRateMax - 1) / SteadyTxRateMax
	}
	txRate := float64(rate) / float64(perTx)
	return perTx, max(1, int(txRate*span.Seconds())), time.Duration(float64(time.Second) / txRate)
}

// produce runs SteadyProducers goroutines that write rate messages per
// second with writer for warmup and then d, in transactions of
// ceil(rate / SteadyTxRateMax) messages, paced by a schedule (open loop: a
// late producer does not wait, it catches up); perTx 0 means as few as
// SteadyTxRateMax allows (see txShape). measure, if not nil, is
// called when the warm-up ends; committed, if not nil, with the IDs of
// every transaction and the time its Commit returned. It returns the
// messages written and how long it took.
func produce(ctx context.Context, env *Env, k Knobs, writer *postgres.Writer, rate, perTx int, warmup, d time.Duration, measure func(), committed func(ids []string, t time.Time)) (int, time.Duration, error) {
	perTx, txs, interval := txShape(rate, perTx, warmup+d)
	var next, seq atomic.Int64
	start := time.Now()
	if measure != nil {
		t := time.AfterFunc(warmup, measure)
		defer t.Stop()
	}
	g, gctx := errgroup.WithContext(ctx)
	for range SteadyProducers {
		g.Go(func() error {
			msgs := make([]outbox.Message, perTx)
			ids := make([]string, perTx)
			for {
				j := next.Add(1) - 1
				if j >= int64(txs) {
					return nil
				}
				if wait := time.Until(start.Add(time.Duration(j) * interval)); wait > 0 {
					t := time.NewTimer(wait)
					select {
					case <-gctx.Done():
						t.Stop()
						return gctx.Err()
					case <-t.C:
					}
				}
				for i := range msgs {
					msgs[i] = env.message(k, int(seq.Add(1)-1))
					msgs[i].ID = outbox.NewID()
					ids[i] = msgs[i].ID
				}
				err := pgx.BeginFunc(gctx, env.Pool, func(tx pgx.Tx) error { return writer.Write(gctx, tx, msgs...) })
				if err != nil {
					return fmt.Errorf("bench: steady: write: %w", err)
				}
				if committed != nil {
					committed(ids, time.Now())
				}
			}
		})
	}
	err := g.Wait()
	return txs * perTx, time.Since(start), err
}

// runSteady runs steady/wal for Run, at o.SteadyRate, or
// horizon/wal-free@2000 or horizon/wal-held@2000.
func runSteady(ctx context.Context, env *Env, o Options, k Knobs, rep *Report, name string) (*Result, error) {
	rate := o.SteadyRate
	res := rep.startOnce(env, name, k)
	var (
		l   *Latency
		r   RunResult
		err error
	)
	hold := name == HorizonWALHeldName
	if name != SteadyWALName {
		rate = horizonRate
	}
	pprof.Do(ctx, pprof.Labels("scenario", name), func(ctx context.Context) {
		l, r, err = steadyWAL(ctx, env, k, rate, o.SteadyWarmup, o.SteadyDuration, hold)
	})
	if err != nil {
		res.Err = err.Error()
		return res, err
	}
	res.Latency = l
	res.once(r, l.Achieved)
	return res, nil
}

func runRates(runs []RunResult) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = r.MsgsPerSec
	}
	return out
}

// ackRecorder records when each message's Publish call returned without
// an error for it.
type ackRecorder struct {
	outbox.Publisher
	lat *latencies
}

func (a *ackRecorder) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := a.Publisher.Publish(ctx, msgs)
	now := time.Now()
	ids := make([]string, 0, len(msgs))
	for i, m := range msgs {
		if i < len(errs) && errs[i] == nil {
			ids = append(ids, m.ID)
		}
	}
	a.lat.acked(ids, now)
	return errs
}

// latencies pairs commit and acknowledgement times by message ID. Either
// may come first: a relay woken by the commit's NOTIFY can publish before
// the producer's goroutine records the commit.
type latencies struct {
	mu        sync.Mutex
	from      time.Time // commits before it are the warm-up's
	warm      int       // warm-up messages acknowledged
	commits   map[string]time.Time
	early     map[string]time.Time // acknowledged before the commit was recorded
	done      map[string]bool
	samples   []time.Duration
	doneCount atomic.Int64
}

func newLatencies(n int) *latencies {
	return &latencies{
		commits: make(map[string]time.Time, n),
		early:   map[string]time.Time{},
		done:    make(map[string]bool, n),
		samples: make([]time.Duration, 0, n),
	}
}

// setFrom sets the end of the warm-up.
func (l *latencies) setFrom(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.from = t
}

func (l *latencies) committed(ids []string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if a, ok := l.early[id]; ok {
			delete(l.early, id)
			l.add(id, t, max(0, a.Sub(t)))
			continue
		}
		l.commits[id] = t
	}
}

func (l *latencies) acked(ids []string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if l.done[id] {
			continue // a duplicate: the first acknowledgement counts
		}
		if c, ok := l.commits[id]; ok {
			delete(l.commits, id)
			l.add(id, c, t.Sub(c))
			continue
		}
		if _, ok := l.early[id]; !ok {
			l.early[id] = t
		}
	}
}

// add records the latency d of message id, committed at c.
func (l *latencies) add(id string, c time.Time, d time.Duration) {
	l.done[id] = true
	if c.Before(l.from) {
		l.warm++
	} else {
		l.samples = append(l.samples, d)
	}
	l.doneCount.Add(1)
}

// count is how many messages have both times.
func (l *latencies) count() int64 { return l.doneCount.Load() }

func (l *latencies) summary() *Latency {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	warm := l.warm
	l.mu.Unlock()
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	pct := func(p float64) float64 {
		if len(s) == 0 {
			return 0
		}
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	out := &Latency{Messages: len(s), WarmupMessages: warm, P50: pct(0.50), P95: pct(0.95), P99: pct(0.99)}
	if len(s) > 0 {
		out.Max = ms(s[len(s)-1])
	}
	return out
}
