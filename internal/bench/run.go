package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/internal/servers"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Result is the outcome of one scenario over its runs.
type Result struct {
	Scenario string `json:"scenario"`
	Store    string `json:"store"`
	// DB says what the database was: DBDurable, DBFast or DBExternal.
	DB       string `json:"db"`
	Broker   string `json:"broker"`
	Workers  int    `json:"workers"`
	Batch    int    `json:"batch"`
	Messages int    `json:"messages"`
	// MsgsPerSec is the median of the runs; Min and Max bound them.
	MsgsPerSec float64   `json:"msgs_per_sec"`
	Min        float64   `json:"min"`
	Max        float64   `json:"max"`
	Runs       []float64 `json:"runs"`
	// RatioToSeedTuned is MsgsPerSec over seed-tuned's (0 when seed-tuned
	// did not run).
	RatioToSeedTuned float64 `json:"ratio_to_seed_tuned,omitempty"`
	// Reference is the source's published figure for this scenario, and
	// ReferenceSource where it comes from.
	Reference       float64 `json:"reference_msgs_per_sec,omitempty"`
	ReferenceSource string  `json:"reference,omitempty"`
	// Failed counts failed publish attempts over all runs.
	Failed int64 `json:"failed_attempts,omitempty"`
	// Latency is set for the steady/wal scenario.
	Latency *Latency `json:"latency,omitempty"`
	// Load is set for the steady/ORDERING@RATE and idle scenarios.
	Load *Load `json:"load,omitempty"`
	// Err is set when a run failed (the remaining runs were skipped).
	Err string `json:"error,omitempty"`
	// Details holds every run's outcome.
	Details []RunResult `json:"details,omitempty"`
	// DynamoDB holds the DynamoDB requests of the timed parts
	// (dynamodb/relay-key only).
	DynamoDB *DynamoRequests `json:"dynamodb,omitempty"`
}

// Report is the outcome of [Run].
type Report struct {
	Store  string
	Broker string
	// DB says what the database is: DBDurable, DBFast or DBExternal.
	DB      string
	Options Options
	// ShowStatements prints each scenario's top statements
	// (pg_stat_statements) in WriteTable (`outbox bench --statements`);
	// WriteJSON always has them.
	ShowStatements bool
	// Results in run order; ceiling/combined follows ceiling/broker when
	// both ceilings ran.
	Results []*Result
	Targets []Target
	// Outstanding is the dynamodb/outstanding scenario's outcome, if it
	// ran.
	Outstanding *OutstandingReport
	Took        time.Duration

	dynamo *dynamoNotes // set for a DynamoDB store
}

// Result returns the result of a scenario, or nil.
func (r *Report) Result(name string) *Result {
	for _, res := range r.Results {
		if res.Scenario == name {
			return res
		}
	}
	return nil
}

// scenario is a selected scenario with what the output says about it.
type scenario struct {
	name      string
	fn        ScenarioFunc
	workers   int
	batch     int
	messages  int
	ref       float64
	refSource string
}

func scenarioTable(o Options) map[string]scenario {
	m := map[string]scenario{
		SeedNaiveName: {fn: SeedNaive, workers: SeedNaiveWorkers, batch: SeedBatch, messages: o.Messages,
			ref: ArticleNaive, refSource: "article (.NET, RabbitMQ)"},
		SeedTunedName: {fn: SeedTuned, workers: SeedTunedWorkers, batch: SeedBatch, messages: o.Messages,
			ref: ArticleTuned, refSource: "article (.NET, RabbitMQ)"},
		RelayNoneName:     {fn: RelayNone, workers: o.Workers, batch: o.Batch, messages: o.Messages},
		RelayKeyName:      {fn: RelayKey, workers: o.Workers, batch: o.Batch, messages: o.Messages},
		CeilingStoreName:  {fn: CeilingStore, workers: o.Workers, batch: o.Batch, messages: o.Messages},
		CeilingBrokerName: {fn: CeilingBroker, workers: o.Workers, batch: o.Batch, messages: o.Messages},
		RelaysName(1):     {fn: Relays(1), workers: o.Workers, batch: o.Batch, messages: o.Messages},
		RelaysName(2):     {fn: Relays(2), workers: o.Workers, batch: o.Batch, messages: o.Messages},
		RelaysName(3):     {fn: Relays(3), workers: o.Workers, batch: o.Batch, messages: o.Messages},
		RelayWALName:      {fn: RelayWAL, workers: o.Workers, batch: o.Batch, messages: o.Messages},
		CeilingWALName:    {fn: CeilingWAL, workers: o.Workers, batch: o.Batch, messages: o.Messages},
	}
	for _, w := range []struct {
		name    string
		capture postgres.Capture
		perTx   int
	}{
		{WriterTableTx1Name, postgres.CaptureTable, 1}, {WriterWALTx1Name, postgres.CaptureWAL, 1},
		{WriterTableTx10Name, postgres.CaptureTable, 10}, {WriterWALTx10Name, postgres.CaptureWAL, 10},
	} {
		m[w.name] = scenario{fn: Writer(w.capture, w.perTx), workers: SteadyProducers, batch: w.perTx, messages: min(o.Messages, WriterMessagesMax)}
	}
	for i, w := range ScalingWorkers {
		m[ScalingName(w)] = scenario{fn: Scaling(w, o.ScaleMessages), workers: w, batch: o.Batch, messages: o.ScaleMessages,
			ref: ADRRates[i], refSource: "ADR (SKIP LOCKED processors)"}
	}
	for name, s := range m {
		s.name = name
		m[name] = s
	}
	return m
}

// Run runs the selected scenarios: Runs rounds of every drain scenario
// (round-robin), then the steady scenario. Without Options.Store it starts
// a throwaway PostgreSQL server, without Options.Broker an embedded NATS
// server, and says so on Options.Notices.
//
// With a dynamodb:// store only the DynamoDB scenarios run (Runs rounds of
// dynamodb/relay-key, then dynamodb/outstanding once), in tables of the
// bench's own dropped at the end; Options.Notices says so.
//
// The report holds what ran even when err is not nil: err joins the
// failures of scenarios (each also in its Result.Err) or says why the run
// stopped early (ctx ended).
func Run(ctx context.Context, o Options) (*Report, error) {
	messagesDefaulted := o.Messages == 0
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	names, _ := SelectFor(o.Store, o.Scenarios)
	if IsDynamoDB(o.Store) {
		return runDynamo(ctx, o, names, messagesDefaulted)
	}
	if IsMySQL(o.Store) {
		return runMySQL(ctx, o, names)
	}
	began := time.Now()

	dsn := o.Store
	storeName := "postgres"
	db := DBExternal
	if dsn == "" {
		db = DBDurable
		if o.FastDB {
			db = DBFast
		}
		fmt.Fprintf(o.Notices, "bench: no --store given: starting a throwaway PostgreSQL server from the local binaries (%s, removed at exit)\n", dbText(db))
		var stop func() error
		var err error
		dsn, stop, err = servers.StartPostgres(ctx, servers.PostgresOptions{Settings: postgresSettings(o.FastDB)})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer func() {
			if err := stop(); err != nil {
				o.Logger.Warn("bench: stop the throwaway PostgreSQL", "err", err)
			}
		}()
		storeName = "postgres (throwaway, " + dbText(db) + ")"
	}
	if o.Broker == "" {
		fmt.Fprintln(o.Notices, brokerNotice(o))
	}
	broker, err := OpenBroker(ctx, o.Broker, o)
	if err != nil {
		return nil, err
	}
	defer broker.Close()
	env, err := NewEnv(ctx, dsn, broker, o.Workers, o.Logger)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	env.opts, env.db = o, db
	if err := env.applyLayout(ctx); err != nil {
		return nil, err
	}
	if db != DBExternal {
		env.statements = env.enableStatements(ctx)
	}
	storeName = describeStore(ctx, env, storeName)

	rep := &Report{Store: storeName, Broker: broker.Name, DB: db, Options: o}
	table := scenarioTable(o)
	k := Knobs{Messages: o.Messages, Payload: o.Payload, Keys: o.Keys, Batch: o.Batch, Workers: o.Workers}

	var drains []scenario
	for _, n := range names {
		if s, ok := table[n]; ok {
			drains = append(drains, s)
			rep.Results = append(rep.Results, &Result{
				Scenario: n, Store: storeName, DB: db, Broker: broker.Name,
				Workers: s.workers, Batch: s.batch, Messages: s.messages,
				Reference: s.ref, ReferenceSource: s.refSource,
			})
		}
	}

	baseLog := env.Log
	stopProgress := startProgress(o, &env.meter)
	defer stopProgress()
	var errs []error
	for round := 1; round <= o.Runs; round++ {
		for _, s := range drains {
			res := rep.Result(s.name)
			if res.Err != "" {
				continue
			}
			env.meter.scenario(s.name, round, o.Runs)
			env.Log = baseLog.With("scenario", s.name, "run", round)
			var run RunResult
			var err error
			pprof.Do(ctx, pprof.Labels("scenario", s.name), func(ctx context.Context) { run, err = s.fn(ctx, env, k) })
			if err != nil {
				if ctx.Err() != nil {
					rep.finish(began)
					return rep, context.Cause(ctx)
				}
				res.Err = err.Error()
				errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
				continue
			}
			res.Details = append(res.Details, run)
			res.Failed += run.Failed
			if err := env.tidy(ctx); err != nil {
				rep.finish(began)
				return rep, err
			}
		}
	}
	for _, name := range append(LoadScenarioNames(), SteadyWALName, HorizonWALFreeName, HorizonWALHeldName) {
		if !slices.Contains(names, name) {
			continue
		}
		env.Log = baseLog.With("scenario", name)
		var res *Result
		var err error
		if name == SteadyWALName || name == HorizonWALFreeName || name == HorizonWALHeldName {
			res, err = runSteady(ctx, env, o, k, rep, name)
		} else {
			res, err = runLoad(ctx, env, o, k, rep, name)
		}
		if res != nil {
			rep.Results = append(rep.Results, res)
		}
		if err != nil {
			if ctx.Err() != nil {
				rep.finish(began)
				return rep, context.Cause(ctx)
			}
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	rep.finish(began)
	return rep, errors.Join(errs...)
}

// startOnce starts the result of a scenario that runs once, after the
// rounds.
func (r *Report) startOnce(env *Env, name string, k Knobs) *Result {
	env.meter.scenario(name, 1, 1)
	return &Result{Scenario: name, Store: r.Store, DB: r.DB, Broker: r.Broker, Workers: k.Workers, Batch: k.Batch}
}

// once records the single run r of a scenario that runs once (steady,
// steady/wal), whose rate is achieved.
func (res *Result) once(r RunResult, achieved float64) {
	res.Messages = r.Messages
	res.MsgsPerSec, res.Min, res.Max = achieved, achieved, achieved
	res.Runs = []float64{achieved}
	res.Details = []RunResult{r}
	res.Failed = r.Failed
}

// finish computes the medians, ratios, the combined ceiling and targets.
func (r *Report) finish(began time.Time) {
	for _, res := range r.Results {
		if len(res.Details) == 0 {
			continue
		}
		res.Runs = res.Runs[:0]
		for _, d := range res.Details {
			res.Runs = append(res.Runs, d.MsgsPerSec)
		}
		res.MsgsPerSec, res.Min, res.Max = summarize(res.Runs)
	}
	if s, b := r.Result(CeilingStoreName), r.Result(CeilingBrokerName); s != nil && b != nil && s.MsgsPerSec > 0 && b.MsgsPerSec > 0 && r.Result(CeilingName) == nil {
		c := &Result{
			Scenario: CeilingName, Store: r.Store, DB: r.DB, Broker: r.Broker,
			Workers: s.Workers, Batch: s.Batch, Messages: s.Messages,
			MsgsPerSec: combine(s.MsgsPerSec, b.MsgsPerSec),
			Min:        combine(s.Min, b.Min),
			Max:        combine(s.Max, b.Max),
		}
		c.Runs = []float64{}
		i := slices.Index(r.Results, b)
		r.Results = slices.Insert(r.Results, i+1, c)
	}
	if t := r.Result(SeedTunedName); t != nil && t.MsgsPerSec > 0 {
		for _, res := range r.Results {
			if res.MsgsPerSec > 0 && res.Latency == nil && res.Load == nil && !strings.HasPrefix(res.Scenario, "writer/") {
				res.RatioToSeedTuned = res.MsgsPerSec / t.MsgsPerSec
			}
		}
	}
	r.Targets = targets(r)
	r.Took = time.Since(began)
}

// What the database is, in Result.DB and Report.DB.
const (
	// DBDurable is the bench's own server with fsync, synchronous_commit
	// and full_page_writes on: what users run.
	DBDurable = "durable"
	// DBFast is the bench's own server with fsync and full_page_writes
	// off (--fast-db).
	DBFast = "fast"
	// DBExternal is a --store server: whatever it is configured to do.
	DBExternal = "external"
)

// dbText says what a DB value means, for headings.
func dbText(db string) string {
	switch db {
	case DBDurable:
		return "durable: fsync=on, synchronous_commit=on, full_page_writes=on"
	case DBFast:
		return "fast: fsync=off, full_page_writes=off (--fast-db)"
	}
	return "external: --store, as configured"
}

// postgresSettings are the settings of the bench's own server: durable
// unless fast, and pg_stat_statements loaded.
func postgresSettings(fast bool) map[string]string {
	s := map[string]string{
		"fsync":                    "on",
		"synchronous_commit":       "on",
		"full_page_writes":         "on",
		"shared_preload_libraries": "pg_stat_statements",
		// Planning counted too: a custom plan per call is hidden work.
		"pg_stat_statements.track_planning": "on",
	}
	if fast {
		s["fsync"], s["full_page_writes"] = "off", "off"
	}
	return s
}

// combine is the throughput of doing both jobs one after the other:
// 1 / (1/a + 1/b).
func combine(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return 1 / (1/a + 1/b)
}

// summarize returns the median, min and max of xs.
func summarize(xs []float64) (median, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// describeStore names the server: its version and where it runs.
func describeStore(ctx context.Context, env *Env, kind string) string {
	var version string
	if err := env.Pool.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return kind
	}
	cc := env.Pool.Config().ConnConfig
	return fmt.Sprintf("%s %s (%s:%d/%s)", kind, version, cc.Host, cc.Port, cc.Database)
}

// startProgress calls o.Progress about 4 times a second until the returned
// function is called.
func startProgress(o Options, m *meter) func() {
	if o.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if p, ok := m.progress(); ok {
				o.Progress(p)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
