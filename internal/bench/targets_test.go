package bench

import (
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
			{Scenario: SteadyName, MsgsPerSec: 1, Latency: &Latency{P99: p99, CPUBusy: busy, CPUs: 2}},
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
		{"met", report(30_000, 70_000, 100_000, 99, 10), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := targets(c.r)
			if got := find(ts, "relay/key ≥ 2").Limit; (got != "") != c.seedLimit {
				t.Errorf("2 × seed-tuned limit %q, want one: %v", got, c.seedLimit)
			}
			if got := find(ts, "commit→ack").Limit; (got != "") != c.p99Limit {
				t.Errorf("p99 limit %q, want one: %v", got, c.p99Limit)
			}
		})
	}
	if l := find(targets(report(60_000, 70_000, 100_000, 99, 500)), "relay/key ≥ 2").Limit; !strings.Contains(l, "120,000") || !strings.Contains(l, "100,000") {
		t.Errorf("limit %q: want it to name 2 × seed-tuned (120,000) and the ceiling (100,000)", l)
	}
}
