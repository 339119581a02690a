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
	rep, err := Run(ctx, Options{
		Store:          dsn,
		Broker:         srv.ClientURL(),
		Messages:       tinyMessages,
		Keys:           50,
		Batch:          100,
		Workers:        2,
		Runs:           1,
		SteadyRate:     400,
		SteadyDuration: time.Second,
		SteadyWarmup:   250 * time.Millisecond,
		Notices:        &notices,
		Progress:       func(Progress) { progress++ },
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var got []string
	for _, res := range rep.Results {
		got = append(got, res.Scenario)
		if res.Err != "" {
			t.Errorf("%s failed: %s", res.Scenario, res.Err)
		}
		if !(res.MsgsPerSec > 0) {
			t.Errorf("%s: msgs_per_sec = %v, want > 0", res.Scenario, res.MsgsPerSec)
		}
		if res.Scenario == CeilingName || res.Scenario == SteadyName || res.Scenario == SteadyWALName {
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
	for _, name := range []string{SteadyName, SteadyWALName} {
		st := rep.Result(name)
		if st == nil || st.Latency == nil {
			t.Fatalf("no %s latency in the report", name)
		}
		if l := st.Latency; l.ClientCPUMicros <= 0 || runtime.GOOS == "linux" && l.ServerCPUMicros <= 0 {
			t.Errorf("%s: CPU per message %v (bench), %v (PostgreSQL); want both measured", name, l.ClientCPUMicros, l.ServerCPUMicros)
		}
	}
	st := rep.Result(SteadyName)
	if l := st.Latency; l.Messages+l.WarmupMessages != st.Messages || l.Messages == 0 || l.WarmupMessages == 0 || !(l.P99 >= l.P50) || !(l.Max >= l.P99) {
		t.Errorf("steady latency %+v for %d messages: want every message either measured or in the warm-up, some of each, and p50 <= p99 <= max", *l, st.Messages)
	}
	if l := st.Latency; runtime.GOOS == "linux" && !(l.CPUBusy > 0 && l.CPUBusy <= 100) {
		t.Errorf("steady: CPU busy %v%%, want a share of the machine's CPU time (0, 100]", l.CPUBusy)
	}
	for _, tg := range rep.Targets {
		if !tg.Measured {
			t.Errorf("target %q not measured", tg.Name)
		}
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"relay/key", "seed-tuned", "ceiling/combined", "ADR EVENTS/S", "P99 MS", "targets", "32,500", "capture modes", "writer/wal-tx10", "relay/wal ≥ 1.5 × relay/key", "steady/wal: relay/wal", "steady/wal CPU per message"} {
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
		for _, k := range []string{"scenario", "store", "broker", "workers", "messages", "msgs_per_sec", "runs", "min", "max"} {
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
		{[]string{"steady,seed-naive"}, []string{SeedNaiveName, SteadyName}},
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
			rep, err := Run(ctx, Options{
				Store: dsn, Broker: url, Messages: 500, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
				Scenarios: []string{"seed-*", "relay/*", "ceiling/broker"},
			})
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
