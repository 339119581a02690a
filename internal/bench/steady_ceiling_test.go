package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestSteadyCeiling runs steady/key@1000 on a throwaway PostgreSQL with
// pg_stat_statements and a broker process: the ceiling runs after the
// relay as a process of its own, every message it relays is received,
// the outbox is left empty (the scenario fails otherwise), its CPU and its
// statements are measured, and the table, the targets and the JSON carry
// it.
func TestSteadyCeiling(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, children(Options{
		Keys: 50, Batch: 100, Workers: 2, Runs: 1,
		SteadyDuration: time.Second, SteadyWarmup: 250 * time.Millisecond, SteadyAloneDuration: time.Second,
		Scenarios: []string{SteadyKey1000Name},
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	res := rep.Result(SteadyKey1000Name)
	if res == nil || res.Err != "" || res.Load == nil {
		t.Fatalf("%s: %+v, want a load", SteadyKey1000Name, res)
	}
	checkLoad(t, res)
	c := res.Load.Ceiling
	if c.Rate != 1000 || c.PostgresAloneMicros != res.Load.PostgresAloneMicros || c.AchievedAlone != res.Load.AchievedAlone {
		t.Errorf("ceiling %+v: want rate 1,000 and the relay's producers-alone baseline (%v µs/msg, %v msgs/s)", *c, res.Load.PostgresAloneMicros, res.Load.AchievedAlone)
	}
	// The ceiling's statements: its SELECT and its DELETE, and nothing
	// of the relay's (leases, claims).
	var fetch, del bool
	for _, s := range c.Statements {
		fetch = fetch || strings.Contains(s.Query, "AS c(p, after) CROSS JOIN")
		del = del || strings.HasPrefix(s.Query, "DELETE FROM")
		if strings.Contains(s.Query, "outbox_leases") {
			t.Errorf("the ceiling's statements include the relay's %q", s.Query)
		}
	}
	// Its statements per second are a difference with the producers
	// alone, which at this tiny load can come out at zero or below: only
	// that they were read is checked.
	if !fetch || !del || c.RelayStatementsPerSec == -1 {
		t.Errorf("ceiling statements %+v (%v/s): want its SELECT and DELETE, read", c.Statements, c.RelayStatementsPerSec)
	}
	var relayCPU Target
	for _, tg := range rep.Targets {
		if tg.Name == SteadyKey1000Name+": relay CPU ≤ 40 µs/msg" {
			relayCPU = tg
		}
	}
	if runtime.GOOS == "linux" && (relayCPU.Ceiling != c.CPU.Relay || relayCPU.OverCeiling <= 0) {
		t.Errorf("target %+v: want the ceiling's CPU (%v µs/msg) and the ratio to it", relayCPU, c.CPU.Relay)
	}
	rep.ShowStatements = true
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"\nceiling/steady@1000  ", "ceiling/steady@RATE: run right after steady/key@RATE", "µs/msg (ceiling ", "statements of ceiling/steady@1000"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, b.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Load struct {
			Ceiling *struct {
				CPU struct {
					Relay float64 `json:"relay"`
				} `json:"cpu_us_per_msg"`
				P99 float64 `json:"p99_ms"`
			} `json:"ceiling"`
		} `json:"load"`
	}
	line, _, _ := strings.Cut(js.String(), "\n")
	if err := json.Unmarshal([]byte(line), &obj); err != nil {
		t.Fatalf("JSON %s: %v", line, err)
	}
	if obj.Load.Ceiling == nil || obj.Load.Ceiling.CPU.Relay != c.CPU.Relay {
		t.Errorf("JSON %s: want the ceiling's figures", line)
	}
	if !strings.Contains(js.String(), `"over_ceiling"`) {
		t.Errorf("JSON targets lack the ratio to the ceiling:\n%s", js.String())
	}
	t.Logf("\n%s", b.String())
}

// The ceiling's process relays every message, a row committed below its
// partition's cursor (an earlier seq committed after a later one) too,
// and leaves the outbox empty when stopped with rows it has not seen
// yet: they are swept before it exits.
func TestSteadyCeilingProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := children(Options{Store: testenv.PostgresDSN(t), Broker: testenv.NATS(t).ClientURL(), Keys: 10, Payload: PayloadDefault}.WithDefaults())
	broker, err := OpenBroker(ctx, o.Broker, o)
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	env, err := NewEnv(ctx, o.Store, broker, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	env.opts = o
	k := Knobs{Payload: o.Payload, Keys: o.Keys}
	if err := env.prepareOurs(ctx, k, 0); err != nil {
		t.Fatal(err)
	}
	// Written before the process starts: no notification reaches it.
	write := func(tx pgx.Tx, i int) string {
		m := env.message(k, i)
		m.Key = "same-key" // one partition
		m.ID = outbox.NewID()
		if err := env.writer.Write(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	var ids []string
	if err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error { ids = append(ids, write(tx, 0)); return nil }); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 16)
	stopRecv, err := broker.receive(func(id string) { got <- id })
	if err != nil {
		t.Fatal(err)
	}
	defer stopRecv()
	proc, err := env.startCeiling(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = proc.stop() }()
	receive := func(want string) {
		t.Helper()
		select {
		case id := <-got:
			if id != want {
				t.Fatalf("received %s, want %s", id, want)
			}
		case <-ctx.Done():
			t.Fatalf("message %s never received%s", want, proc.lastWords())
		}
	}
	receive(ids[0])
	// The earlier transaction takes the lower seq and commits last.
	early, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(ctx) }()
	low := write(early, 1)
	var high string
	if err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error { high = write(tx, 2); return nil }); err != nil {
		t.Fatal(err)
	}
	receive(high)
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	receive(low)
	// Stopped right after a commit it may not have read: the final sweep.
	var last string
	if err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error { last = write(tx, 3); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := proc.stop(); err != nil {
		t.Fatal(err)
	}
	if left, err := env.leftOurs(ctx); err != nil || left != 0 {
		t.Fatalf("the outbox holds %d messages after the process stopped (%v), want 0", left, err)
	}
	receive(last)
	if n, err := broker.Stored(ctx); err != nil || n != 4 {
		t.Errorf("the stream holds %d messages (%v), want 4", n, err)
	}
}

// The targets of steady/ORDERING@1000 print the ceiling's figure and the
// ratio to it, and say a bound below the ceiling is out of reach.
func TestSteadyCeilingTargets(t *testing.T) {
	steady := func(name string, relay, added, p99 float64, ceiling *Load) *Result {
		return &Result{Scenario: name, MsgsPerSec: 1000, Load: &Load{Rate: 1000, Achieved: 1000, P99: p99,
			CPU: ProcessCPU{Relay: relay}, PostgresAddedMicros: added, PostgresAloneMicros: 100, Ceiling: ceiling}}
	}
	ceil := &Load{Rate: 1000, Achieved: 1000, P99: 4, CPU: ProcessCPU{Relay: 95, Postgres: 10}, PostgresAddedMicros: 70, PostgresAloneMicros: 100}
	r := &Report{Results: []*Result{
		steady(SteadyKey1000Name, 215, 90, 9, ceil),
		steady(SteadyNone1000Name, 150, 80, 12, nil),
	}}
	r.Targets = targets(r)
	want := map[string]struct {
		ceiling, over float64
		limit         bool
		text          string
	}{
		"steady/key@1000: relay CPU ≤ 40 µs/msg":                                     {95, 215.0 / 95, true, "215.0 µs/msg (ceiling 95.0: 2.26 ×)"},
		"steady/key@1000: PostgreSQL CPU the relay adds ≤ 0.5 × the producers' own":  {0.7, 0.9 / 0.7, true, "0.90 × (ceiling 0.70: 1.29 ×)"},
		"steady/key@1000: commit→receive p99 ≤ 10 ms":                                {4, 9.0 / 4, false, "9.0 ms (ceiling 4.00: 2.25 ×)"},
		"steady/none@1000: relay CPU ≤ 40 µs/msg":                                    {95, 150.0 / 95, true, "150.0 µs/msg (ceiling 95.0: 1.58 ×)"},
		"steady/none@1000: commit→receive p99 ≤ 10 ms":                               {4, 12.0 / 4, false, "12.0 ms (ceiling 4.00: 3.00 ×)"},
		"steady/none@1000: PostgreSQL CPU the relay adds ≤ 0.5 × the producers' own": {0.7, 0.8 / 0.7, true, "0.80 × (ceiling 0.70: 1.14 ×)"},
	}
	seen := 0
	for _, tg := range r.Targets {
		w, ok := want[tg.Name]
		if !ok {
			continue
		}
		seen++
		if abs(tg.Ceiling-w.ceiling) > 1e-9 || abs(tg.OverCeiling-w.over) > 1e-9 || (tg.Limit != "") != w.limit || targetText(tg) != w.text {
			t.Errorf("%s: ceiling %v, × %v, limit %q, text %q; want %v, %v, a limit %v, %q", tg.Name, tg.Ceiling, tg.OverCeiling, tg.Limit, targetText(tg), w.ceiling, w.over, w.limit, w.text)
		}
	}
	if seen != len(want) {
		t.Errorf("%d of the %d targets found in %+v", seen, len(want), r.Targets)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"\nceiling/steady@1000  1,000", "215.0 µs/msg (ceiling 95.0: 2.26 ×)  ✗  out of reach here: the steady-load ceiling itself measured 95.0 µs/msg"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, b.String())
		}
	}
	// Without a ceiling, the targets read as before.
	r = &Report{Results: []*Result{steady(SteadyKey1000Name, 215, 90, 9, nil)}}
	for _, tg := range targets(r) {
		if tg.Ceiling != 0 || tg.OverCeiling != 0 || strings.Contains(targetText(tg), "ceiling") {
			t.Errorf("%s: %+v without a ceiling", tg.Name, tg)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
