package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// tiny is the workload of the tests: every scenario, once, in seconds.
const tinyMessages = 2000

// TestRunEveryScenario runs every scenario once through Run on a tiny
// workload against test servers, and checks what the bench promises: a
// rate for each, an empty outbox and every message in the stream after
// every drain. No timing is asserted.
func TestRunEveryScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dsn := testenv.PostgresDSN(t)
	srv := testenv.NATS(t)
	var notices bytes.Buffer
	var progress int
	rep, err := Run(ctx, children(Options{
		Store:          dsn,
		Broker:         srv.ClientURL(),
		Messages:       tinyMessages,
		Keys:           50,
		Batch:          100,
		Workers:        2,
		Runs:           1,
		SteadyDuration: time.Second,
		SteadyWarmup:   250 * time.Millisecond,
		IdleDuration:   time.Second,
		Notices:        &notices,
		Progress:       func(Progress) { progress++ },
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var got []string
	for _, res := range rep.Results {
		got = append(got, res.Scenario)
		if res.Err != "" {
			t.Errorf("%s failed: %s", res.Scenario, res.Err)
		}
		if !(res.MsgsPerSec > 0) && res.Scenario != IdleName {
			t.Errorf("%s: msgs_per_sec = %v, want > 0", res.Scenario, res.MsgsPerSec)
		}
		if res.DB != DBExternal {
			t.Errorf("%s: db %q, want %q (a --store server)", res.Scenario, res.DB, DBExternal)
		}
		if res.Load != nil {
			checkLoad(t, res)
			continue
		}
		if res.Scenario == CeilingName || res.Scenario == SteadyWALName || res.Scenario == HorizonWALFreeName || res.Scenario == HorizonWALHeldName {
			continue
		}
		if len(res.Details) != 1 || len(res.Runs) != 1 {
			t.Errorf("%s: %d runs (%d rates), want 1", res.Scenario, len(res.Details), len(res.Runs))
			continue
		}
		r := res.Details[0]
		if r.Messages != res.Messages {
			t.Errorf("%s: run of %d messages, want %d", res.Scenario, r.Messages, res.Messages)
		}
		if strings.HasPrefix(res.Scenario, "writer/") {
			// Writers alone: no relay, no broker.
			if r.TxPerSec <= 0 || r.ClientCPUMicros <= 0 {
				t.Errorf("%s: %v tx/s, %v µs of bench CPU per message; want both measured", res.Scenario, r.TxPerSec, r.ClientCPUMicros)
			}
			continue
		}
		if c := r.CPU; c == nil || runtime.GOOS == "linux" && !((c.Postgres > 0 || res.Scenario == CeilingBrokerName) && c.Relay > 0) {
			t.Errorf("%s: CPU per process %+v, want PostgreSQL's and the relay's measured", res.Scenario, c)
		} else if strings.HasPrefix(res.Scenario, "relay") && c.Relay < 0 {
			t.Errorf("%s: the relay process's CPU was not measured: %+v", res.Scenario, c)
		}
		if strings.HasPrefix(res.Scenario, "relays/") && res.Scenario != RelaysName(1) {
			if sum := sumOf(r.RelayShares); len(r.RelayShares) == 0 || sum < 0.999 || sum > 1.001 {
				t.Errorf("%s: relay shares %v, want one per process summing to 1", res.Scenario, r.RelayShares)
			}
		}
		if res.Scenario != CeilingBrokerName && r.Left != 0 {
			t.Errorf("%s: left %d messages in the outbox, want 0", res.Scenario, r.Left)
		}
		if res.Scenario != CeilingStoreName && res.Scenario != CeilingWALName && r.Stored != int64(r.Messages) {
			t.Errorf("%s: the stream holds %d messages, want %d", res.Scenario, r.Stored, r.Messages)
		}
	}
	want := append(ScenarioNames(), CeilingName)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("scenarios in the report: %v, want %v", got, want)
	}
	if s := rep.Result(ScalingName(8)); s != nil && s.Messages != tinyMessages {
		t.Errorf("scaling ran on %d messages, want %d (the backlog, smaller than 10,000)", s.Messages, tinyMessages)
	}
	st := rep.Result(SteadyWALName)
	if st == nil || st.Latency == nil {
		t.Fatalf("no %s latency in the report", SteadyWALName)
	}
	if l := st.Latency; l.ClientCPUMicros <= 0 || runtime.GOOS == "linux" && l.ServerCPUMicros <= 0 {
		t.Errorf("%s: CPU per message %v (bench), %v (PostgreSQL); want both measured", SteadyWALName, l.ClientCPUMicros, l.ServerCPUMicros)
	}
	if l := st.Latency; l.Messages+l.WarmupMessages != st.Messages || l.Messages == 0 || l.WarmupMessages == 0 || !(l.P99 >= l.P50) || !(l.Max >= l.P99) {
		t.Errorf("steady latency %+v for %d messages: want every message either measured or in the warm-up, some of each, and p50 <= p99 <= max", *l, st.Messages)
	}
	if l := st.Latency; runtime.GOOS == "linux" && !(l.CPUBusy > 0 && l.CPUBusy <= 100) {
		t.Errorf("steady: CPU busy %v%%, want a share of the machine's CPU time (0, 100]", l.CPUBusy)
	}
	for _, name := range []string{HorizonFreeName, HorizonHeldName} {
		res := rep.Result(name)
		if res == nil || res.Load == nil {
			t.Fatalf("no %s load in the report", name)
		}
		if l := res.Load; l.HeldXmin != (name == HorizonHeldName) || l.DeadTuples < 0 || l.FetchMeanMs <= 0 || l.SettleMeanMs <= 0 {
			t.Errorf("%s: held %v, dead tuples %d, fetch %v ms, settle %v ms; want the hold as named and all read", name, l.HeldXmin, l.DeadTuples, l.FetchMeanMs, l.SettleMeanMs)
		}
	}
	for _, name := range []string{HorizonWALFreeName, HorizonWALHeldName} {
		if res := rep.Result(name); res == nil || res.Latency == nil || res.Latency.Rate != 2000 || res.Latency.Messages == 0 {
			t.Errorf("%s: %+v, want a latency at 2,000 msgs/s", name, res)
		}
	}
	for _, tg := range rep.Targets {
		// Statements need pg_stat_statements (not on the test server);
		// what the relay adds to PostgreSQL's CPU is a difference of two
		// measurements, which at this tiny load can come out at zero or
		// below (then not measured), in either ordering.
		if !tg.Measured && !strings.Contains(tg.Name, "statements/s") && !strings.Contains(tg.Name, "the relay adds") {
			t.Errorf("target %q not measured", tg.Name)
		}
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"relay/key", "seed-tuned", "ceiling/combined", "ADR EVENTS/S", "P99 MS", "targets", "32,500", "capture modes", "writer/wal-tx10", "relay/wal ≥ 1.5 × relay/key", "steady/wal [external database]: relay/wal", "steady/wal CPU per message",
		"db:     external", "relay processes [external database]", "relays/3", "steady load [external database]", "steady/none@5000", "idle: one `outbox relay` process",
		"xmin horizon [external database]", "horizon/held@2000", "held ÷ free", "horizon/wal-held@2000", "CPU µs/MSG PG", "relay/key ≥ 0.95 × relay/none"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, table.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	if len(lines) != len(rep.Results)+1 {
		t.Fatalf("JSON: %d lines, want one per scenario plus targets (%d)", len(lines), len(rep.Results)+1)
	}
	for _, line := range lines[:len(lines)-1] {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		for _, k := range []string{"scenario", "store", "db", "broker", "workers", "messages", "msgs_per_sec", "runs", "min", "max"} {
			if _, ok := obj[k]; !ok {
				t.Errorf("JSON object %s lacks %q", line, k)
			}
		}
	}
	svg := filepath.Join(t.TempDir(), "bench.svg")
	if err := rep.WritePlot(svg); err != nil {
		t.Fatalf("WritePlot: %v", err)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("scaling")) {
		t.Errorf("the plot is not an SVG with the scaling panel (%d bytes, %v)", len(b), err)
	}
	if progress == 0 {
		t.Errorf("Progress was never called")
	}
	t.Logf("\n%s", table.String())
}

func TestRunResultCheck(t *testing.T) {
	ok := RunResult{Messages: 10, Stored: 10, Left: 0}
	if err := ok.check(); err != nil {
		t.Errorf("check of a complete run: %v", err)
	}
	for _, r := range []RunResult{
		{Messages: 10, Stored: 9, Left: 0},  // lost in the broker
		{Messages: 10, Stored: 11, Left: 0}, // duplicated
		{Messages: 10, Stored: 10, Left: 1}, // left behind
	} {
		if err := r.check(); err == nil {
			t.Errorf("check(%+v) = nil, want an error", r)
		}
	}
	unknown := RunResult{Messages: 10, Stored: -1, Left: -1}
	if err := unknown.check(); err != nil {
		t.Errorf("check with nothing to check: %v", err)
	}
}

func TestSelect(t *testing.T) {
	cases := []struct {
		in   []string
		want []string
	}{
		{nil, ScenarioNames()},
		{[]string{"relay/*"}, []string{RelayNoneName, RelayKeyName, RelayWALName}},
		{[]string{"writer/*", "ceiling/wal"}, []string{CeilingWALName, WriterTableTx1Name, WriterWALTx1Name, WriterTableTx10Name, WriterWALTx10Name}},
		{[]string{"steady/*,seed-naive"}, []string{SeedNaiveName, SteadyKey1000Name, SteadyNone1000Name, SteadyKey5000Name, SteadyNone5000Name, SteadyWALName}},
		{[]string{"relays/*", "idle"}, []string{"relays/1", "relays/2", "relays/3", IdleName}},
		{[]string{"horizon/*"}, []string{HorizonFreeName, HorizonHeldName, HorizonWALFreeName, HorizonWALHeldName}},
		{[]string{"scaling/*", "relay/key"}, []string{RelayKeyName, "scaling/w1", "scaling/w2", "scaling/w4", "scaling/w8"}},
	}
	for _, c := range cases {
		got, err := Select(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Select(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"nope", "relay/[", "seed"} {
		_, err := Select([]string{bad})
		var oe *OptionError
		if err == nil || !errors.As(err, &oe) || oe.Flag != "scenarios" {
			t.Errorf("Select(%q) = %v, want an OptionError naming --scenarios", bad, err)
		}
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	cases := map[string]Options{
		"messages":        {Messages: -1},
		"payload":         {Payload: 4},
		"keys":            {Keys: -3},
		"batch":           {Batch: BatchSizeMax + 1},
		"workers":         {Workers: WorkersMax + 1},
		"runs":            {Runs: -1},
		"steady-rate":     {SteadyRate: -5},
		"steady-duration": {SteadyDuration: -time.Second},
		"idle-duration":   {IdleDuration: -time.Second},
		"fast-db":         {FastDB: true, Store: "postgres://localhost/db"},
		"broker-process":  {BrokerProcess: "docker"},
		"steady-consumer": {SteadyConsumer: "push"},

		"steady-alone-duration": {SteadyAloneDuration: -time.Second},
	}
	for flag, o := range cases {
		err := o.WithDefaults().Validate()
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Flag != flag {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", o, err, flag)
		}
	}
	if err := (Options{}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestSummarizeAndCombine(t *testing.T) {
	if m, lo, hi := summarize([]float64{3, 1, 2}); m != 2 || lo != 1 || hi != 3 {
		t.Errorf("summarize odd = %v %v %v", m, lo, hi)
	}
	if m, _, _ := summarize([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("summarize even median = %v, want 2.5", m)
	}
	if c := combine(100, 100); c != 50 {
		t.Errorf("combine(100, 100) = %v, want 50", c)
	}
	if got := thousands(1234567.4); got != "1,234,567" {
		t.Errorf("thousands = %q", got)
	}
	if got := thousands(999); got != "999" {
		t.Errorf("thousands = %q", got)
	}
}

func TestLatenciesPairAckBeforeCommit(t *testing.T) {
	l := newLatencies(3)
	t0 := time.Now()
	l.committed([]string{"a"}, t0)
	l.acked([]string{"a", "b"}, t0.Add(5*time.Millisecond)) // b acked before its commit was recorded
	l.committed([]string{"b"}, t0.Add(6*time.Millisecond))
	l.acked([]string{"a"}, t0.Add(50*time.Millisecond)) // a duplicate: ignored
	if n := l.count(); n != 2 {
		t.Fatalf("count = %d, want 2", n)
	}
	s := l.summary()
	if s.Max != 5 || s.P50 != 0 {
		t.Errorf("summary = %+v, want max 5 ms (a) and p50 0 ms (b, clamped)", *s)
	}
}

func TestPayloadSize(t *testing.T) {
	for _, n := range []int{PayloadMin, 9, 200, 2713} {
		p := makePayload(n)
		if len(p) != n || !json.Valid(p) {
			t.Errorf("makePayload(%d) = %d bytes, valid JSON %v", n, len(p), json.Valid(p))
		}
	}
}

// checkLoad checks a steady/ORDERING@RATE or idle outcome: every
// process's CPU measured (on Linux), the latencies in order.
func checkLoad(t *testing.T, res *Result) {
	t.Helper()
	l := res.Load
	if runtime.GOOS == "linux" && !(l.Core.Relay >= 0 && l.Core.Postgres >= 0) {
		t.Errorf("%s: CPU %+v, want the relay's and PostgreSQL's measured", res.Scenario, l.Core)
	}
	if res.Scenario == IdleName {
		return
	}
	if runtime.GOOS == "linux" && !(l.Alone.Postgres > 0 && l.Core.Producers > 0 && l.CPU.Relay > 0 && l.PostgresAloneMicros > 0) {
		t.Errorf("%s: CPU %+v alone %+v per message %+v, PostgreSQL alone %v µs/msg; want each measured", res.Scenario, l.Core, l.Alone, l.CPU, l.PostgresAloneMicros)
	}
	if l.Messages == 0 || !(l.P99 >= l.P50) || !(l.Max >= l.P99) || !(l.Achieved > 0) || !(l.AchievedAlone > 0) || l.PerTx != SteadyPerTx {
		t.Errorf("%s: %+v: want messages measured, p50 <= p99 <= max, both rates and %d messages per transaction", res.Scenario, *l, SteadyPerTx)
	}
	// Received by a durable consumer, routed to a core subscription
	// first: a message is stored (and so delivered) after it is routed.
	if !strings.Contains(l.Consumer, "durable") || !(l.RoutedP50 > 0) || !(l.RoutedMax >= l.RoutedP99 && l.RoutedP99 >= l.RoutedP50) {
		t.Errorf("%s: consumer %q, routed p50/p99/max %v/%v/%v: want a durable consumer and the routed latencies in order", res.Scenario, l.Consumer, l.RoutedP50, l.RoutedP99, l.RoutedMax)
	}
	if len(res.Details) != 1 || res.Details[0].Left != 0 || res.Details[0].Stored != int64(res.Details[0].Messages) {
		t.Errorf("%s: runs %+v, want one that left nothing behind and stored every message", res.Scenario, res.Details)
	}
	// The steady-load ceiling runs after steady/key@RATE only; it left the
	// outbox empty and stored every message once, or the scenario failed.
	c := l.Ceiling
	if wantCeiling := res.Scenario == SteadyKey1000Name || res.Scenario == SteadyKey5000Name; (c != nil) != wantCeiling {
		t.Errorf("%s: ceiling %+v, want one: %v", res.Scenario, c, wantCeiling)
		return
	}
	if c == nil {
		return
	}
	if c.Messages == 0 || !(c.P99 >= c.P50) || !(c.Max >= c.P99) || !(c.Achieved > 0) || c.Rate != l.Rate {
		t.Errorf("%s: ceiling %+v: want messages measured, p50 <= p99 <= max, the rate achieved", res.Scenario, *c)
	}
	if runtime.GOOS == "linux" && !(c.CPU.Relay > 0 && c.Core.Relay > 0 && c.Core.Postgres > 0 && c.CPU.Producers > 0) {
		t.Errorf("%s: ceiling CPU %+v per message %+v: want its process's, PostgreSQL's and the producers' measured", res.Scenario, c.Core, c.CPU)
	}
}

func sumOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// TestOtherBrokers runs the seeds, our relay and the broker ceiling on
// RabbitMQ and Kafka (kfake) through backends.OpenPublisher, and checks
// that every message reached the bench's queue or topic.
func TestOtherBrokers(t *testing.T) {
	brokers := map[string]func(t *testing.T) string{
		"rabbitmq": func(t *testing.T) string { return testenv.RabbitMQ(t) },
		"kafka": func(t *testing.T) string {
			seeds, _ := testenv.Kafka(t)
			return "kafka://" + strings.Join(seeds, ",")
		},
	}
	for name, start := range brokers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			dsn := testenv.PostgresDSN(t)
			url := start(t)
			rep, err := Run(ctx, children(Options{
				Store: dsn, Broker: url, Messages: 500, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
				Scenarios: []string{"seed-*", "relay/*", "ceiling/broker"},
			}))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !strings.HasPrefix(rep.Broker, name) {
				t.Errorf("broker described as %q, want it to start with %q", rep.Broker, name)
			}
			for _, res := range rep.Results {
				if res.Scenario == CeilingName {
					continue
				}
				if len(res.Details) != 1 {
					t.Fatalf("%s: %d runs, want 1 (error %q)", res.Scenario, len(res.Details), res.Err)
				}
				r := res.Details[0]
				if !(r.MsgsPerSec > 0) || r.Stored != int64(r.Messages) {
					t.Errorf("%s: %v msgs/s, %d of %d messages stored", res.Scenario, r.MsgsPerSec, r.Stored, r.Messages)
				}
			}
		})
	}
}

// TestOwnServerAndBroker runs the bench as `outbox bench` does without
// --store and --broker: a durable throwaway PostgreSQL with
// pg_stat_statements loaded, a broker process, and the relay as a
// process; every row says the database is durable, the statements of each
// run are read, and the broker process's CPU is measured.
func TestOwnServerAndBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, children(Options{
		Messages: 500, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
		Scenarios: []string{RelayKeyName, CeilingStoreName},
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.DB != DBDurable || !strings.Contains(rep.Store, "fsync=on") || !strings.Contains(rep.Broker, "a process of its own: nats-server v") {
		t.Errorf("db %q, store %q, broker %q: want a durable throwaway server and nats-server as the broker process", rep.DB, rep.Store, rep.Broker)
	}
	for _, res := range rep.Results {
		if res.DB != DBDurable || len(res.Details) != 1 {
			t.Fatalf("%s: db %q, %d runs (error %q); want durable, 1 run", res.Scenario, res.DB, len(res.Details), res.Err)
		}
		r := res.Details[0]
		if len(r.Statements) == 0 || r.StatementCalls <= 0 {
			t.Errorf("%s: statements %+v (%d calls), want the run's from pg_stat_statements", res.Scenario, r.Statements, r.StatementCalls)
		}
		var plans int64
		for _, s := range r.Statements {
			plans += s.Plans
		}
		if plans <= 0 {
			t.Errorf("%s: statements %+v planned 0 times, want planning counted (pg_stat_statements.track_planning)", res.Scenario, r.Statements)
		}
		if res.Scenario == RelayKeyName && runtime.GOOS == "linux" && !(r.CPU != nil && r.CPU.Broker > 0 && r.CPU.Relay > 0) {
			t.Errorf("%s: CPU %+v, want the broker and relay processes measured", res.Scenario, r.CPU)
		}
	}
	rep.ShowStatements = true
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"db:     durable", "drains [durable database]", "statements of relay/key [durable database]"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, b.String())
		}
	}
}

// TestEmbeddedBrokerProcess runs a scenario with the broker process of
// --broker-process embedded: the bench's binary as `outbox bench
// broker-process`, whose CPU is measured as the broker's.
func TestEmbeddedBrokerProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, children(Options{
		Store: testenv.PostgresDSN(t), BrokerProcess: BrokerEmbedded,
		Messages: 500, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
		Scenarios: []string{RelayKeyName},
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(rep.Broker, "broker-process, embedded nats-server v") {
		t.Errorf("broker %q: want the embedded broker process", rep.Broker)
	}
	res := rep.Result(RelayKeyName)
	if res == nil || res.Err != "" || len(res.Details) != 1 {
		t.Fatalf("%s: %+v, want one run", RelayKeyName, res)
	}
	if r := res.Details[0]; runtime.GOOS == "linux" && !(r.CPU != nil && r.CPU.Broker > 0) {
		t.Errorf("CPU %+v, want the broker process measured", r.CPU)
	}
}
