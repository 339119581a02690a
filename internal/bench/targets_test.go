package bench

import (
	"math"
	"strings"
	"testing"
)

// A missed target says when the same invocation shows the machine cannot
// meet it, and only then.
func TestTargetLimits(t *testing.T) {
	report := func(seed, key, ceiling, busy, p99 float64) *Report {
		return &Report{Results: []*Result{
			{Scenario: SeedTunedName, MsgsPerSec: seed},
			{Scenario: RelayKeyName, MsgsPerSec: key},
			{Scenario: RelayNoneName, MsgsPerSec: key},
			{Scenario: CeilingName, MsgsPerSec: ceiling},
			{Scenario: SteadyWALName, MsgsPerSec: 1, Latency: &Latency{Rate: 1000, P99: p99, CPUBusy: busy, CPUs: 2}},
		}}
	}
	find := func(ts []Target, prefix string) Target {
		for _, tg := range ts {
			if strings.HasPrefix(tg.Name, prefix) {
				return tg
			}
		}
		t.Fatalf("no target %q in %+v", prefix, ts)
		return Target{}
	}
	for _, c := range []struct {
		name                string
		r                   *Report
		seedLimit, p99Limit bool
	}{
		{"bounds above the machine", report(60_000, 70_000, 100_000, 99, 500), true, true},
		{"reachable, missed", report(40_000, 70_000, 100_000, 80, 40), false, false},
		{"met", report(30_000, 70_000, 100_000, 99, 5), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := targets(c.r)
			if got := find(ts, "relay/key ≥ 2").Limit; (got != "") != c.seedLimit {
				t.Errorf("2 × seed-tuned limit %q, want one: %v", got, c.seedLimit)
			}
			if got := find(ts, "steady/wal commit→ack").Limit; (got != "") != c.p99Limit {
				t.Errorf("p99 limit %q, want one: %v", got, c.p99Limit)
			}
		})
	}
	if l := find(targets(report(60_000, 70_000, 100_000, 99, 500)), "relay/key ≥ 2").Limit; !strings.Contains(l, "120,000") || !strings.Contains(l, "100,000") {
		t.Errorf("limit %q: want it to name 2 × seed-tuned (120,000) and the ceiling (100,000)", l)
	}
}

// Issue #12's targets: each computed from the scenarios it names, met or
// missed on the right side of its bound, and unmeasured when a scenario
// failed.
func TestIssue12Targets(t *testing.T) {
	drain := func(name string, rate, pg float64) *Result {
		return &Result{Scenario: name, MsgsPerSec: rate, Details: []RunResult{{MsgsPerSec: rate, CPU: &ProcessCPU{Postgres: pg, Broker: 10, Relay: 20, Producers: -1}}}}
	}
	steady := func(name string, achieved, p99, relay, added, alone float64) *Result {
		return &Result{Scenario: name, MsgsPerSec: achieved, Load: &Load{
			Rate: map[bool]float64{true: 1000, false: 5000}[strings.Contains(name, "@1000")], Achieved: achieved, P99: p99,
			CPU: ProcessCPU{Relay: relay}, PostgresAddedMicros: added, PostgresAloneMicros: alone,
		}}
	}
	r := &Report{Results: []*Result{
		drain(RelayKeyName, 30_000, 29),
		drain(RelayNoneName, 37_000, 17),
		drain(CeilingName, 34_000, 0),
		{Scenario: CeilingStoreName}, {Scenario: CeilingBrokerName},
		drain(RelaysName(1), 30_000, 20),
		drain(RelaysName(2), 18_600, 35),
		{Scenario: RelaysName(3), Err: "failed"},
		steady(SteadyKey1000Name, 1000, 34, 50, 520, 115),
		steady(SteadyNone1000Name, 1000, 7, 20, 50, 115),
		steady(SteadyKey5000Name, 2500, 300, 30, 100, 40),
		steady(SteadyNone5000Name, 5000, 20, 20, 10, 40),
		{Scenario: IdleName, Load: &Load{Core: ProcessCPU{Relay: 0.7}, RelayStatementsPerSec: 8.4}},
	}}
	ts := targets(r)
	r.Targets = ts
	want := map[string]struct {
		got       float64
		met, meas bool
	}{
		"relay/key PostgreSQL CPU/msg ≤ 1.15 × relay/none's":                         {29.0 / 17, false, true},
		"relay/key ≥ 0.95 × relay/none":                                              {30.0 / 37, false, true},
		"relay/key ≥ 0.85 × combined ceiling":                                        {30.0 / 34, true, true},
		"relays/2 ≥ relays/1":                                                        {0.62, false, true},
		"relays/3 ≥ relays/1":                                                        {0, false, false},
		"relays/2 CPU/msg (PostgreSQL + broker + relays) ≤ 1.1 × relays/1's":         {65.0 / 50, false, true},
		"relays/3 CPU/msg (PostgreSQL + broker + relays) ≤ 1.1 × relays/1's":         {0, false, false},
		"steady/key@1000: PostgreSQL CPU the relay adds ≤ 0.5 × the producers' own":  {520.0 / 115, false, true},
		"steady/none@1000: PostgreSQL CPU the relay adds ≤ 0.5 × the producers' own": {50.0 / 115, true, true},
		"steady/key@1000: relay CPU ≤ 40 µs/msg":                                     {50, false, true},
		"steady/none@1000: commit→receive p99 ≤ 10 ms":                               {7, true, true},
		"steady/key@1000: p99 within 1.2 × steady/none@1000":                         {34.0 / 7, false, true},
		"steady/key@5000: producers reach the offered rate (≥ 0.98 ×)":               {0.5, false, true},
		"steady/none@5000: producers reach the offered rate (≥ 0.98 ×)":              {1, true, true},
		"steady/none@5000: commit→receive p99 ≤ 25 ms":                               {20, true, true},
		"steady/key@5000: relay CPU/msg within 1.2 × steady/none@5000":               {1.5, false, true},
		"idle: relay CPU ≤ 1% of a core":                                             {0.7, true, true},
		"idle: ≤ 2 statements/s per relay":                                           {8.4, false, true},
	}
	seen := map[string]bool{}
	for _, tg := range ts {
		w, ok := want[tg.Name]
		if !ok {
			continue
		}
		seen[tg.Name] = true
		if tg.Measured != w.meas || tg.Met != w.met || w.meas && math.Abs(tg.Got-w.got) > 1e-9 {
			t.Errorf("%s: got %v met %v measured %v; want %v, %v, %v", tg.Name, tg.Got, tg.Met, tg.Measured, w.got, w.met, w.meas)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no target %q", name)
		}
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"0.70% of a core", "8.4 statements/s", "50.0 µs/msg", "50.0 µs/msg       ✗"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, b.String())
		}
	}
}
