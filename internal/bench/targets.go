package bench

import (
	"fmt"
	"strings"
)

// Targets of issue #12 (printed, never asserted in tests).
const (
	// TargetKeyPGCPU bounds relay/key's PostgreSQL CPU per message over
	// relay/none's.
	TargetKeyPGCPU = 1.15
	// TargetKeyOverNone and TargetKeyOverCeiling are relay/key's drain
	// rate over relay/none's and over the combined ceiling.
	TargetKeyOverNone    = 0.95
	TargetKeyOverCeiling = 0.85
	// At 1,000 msgs/s: the PostgreSQL CPU the relay adds over the
	// producers' own, the relay's CPU per message, the commit→receive p99.
	TargetAddedPGShare = 0.5
	TargetRelayMicros  = 40.0
	TargetP99At1000Ms  = 10.0
	// At 5,000 msgs/s: the producers reach the offered rate (this share
	// of it), p99.
	TargetReachShare  = 0.98
	TargetP99At5000Ms = 25.0
	// TargetKeyOverNoneLoad bounds key over none on each steady figure.
	TargetKeyOverNoneLoad = 1.2
	// Idle: the relay's CPU in percent of a core, and its statements per
	// second.
	TargetIdleCorePct = 1.0
	TargetIdleQPS     = 2.0
	// TargetRelaysCPU bounds the CPU per message (PostgreSQL, broker and
	// relays together) of N relay processes over one's (issue #25).
	TargetRelaysCPU = 1.1
)

// Target units beyond × and ms.
const (
	unitPct    = "% of a core"
	unitMicros = "µs/msg"
	unitQPS    = "statements/s"
)

// atMost and atLeast build a measured target.
func atMost(name string, got, want float64, unit string) Target {
	return Target{Name: name, Want: want, Got: got, Unit: unit, Measured: got >= 0, Met: got >= 0 && got <= want}
}

func atLeast(name string, got, want float64, unit string) Target {
	return Target{Name: name, Want: want, Got: got, Unit: unit, Measured: got >= 0, Met: got >= 0 && got >= want}
}

// withCeiling adds to an at-most target the same figure of the steady-load
// ceiling (ceiling/steady@RATE, negative: not measured) and the ratio to
// it; a bound below the ceiling is out of reach here whatever the relay
// does.
func withCeiling(t Target, ceiling float64) Target {
	if ceiling <= 0 {
		return t
	}
	t.Ceiling = ceiling
	if t.Measured {
		t.OverCeiling = t.Got / ceiling
	}
	if !t.Met && ceiling > t.Want {
		t.Limit = "out of reach here: the steady-load ceiling itself measured " + targetValue(Target{Got: ceiling, Unit: t.Unit})
	}
	return t
}

// unmeasured is a target whose scenarios did not run or failed.
func unmeasured(name string, want float64, unit string) Target {
	return Target{Name: name, Want: want, Unit: unit}
}

// medianCPU returns the CPU per message of a scenario's median run.
func (r *Report) medianCPU(name string) *ProcessCPU {
	res := r.Result(name)
	if res == nil || res.Err != "" {
		return nil
	}
	if run := res.medianRun(); run != nil {
		return run.CPU
	}
	return nil
}

// load returns a steady or idle scenario's outcome, or nil.
func (r *Report) load(name string) *Load {
	if res := r.Result(name); res != nil && res.Err == "" {
		return res.Load
	}
	return nil
}

// ran reports whether any of the scenarios is in the report.
func (r *Report) ran(names ...string) bool {
	for _, n := range names {
		if r.Result(n) != nil {
			return true
		}
	}
	return false
}

// drainTargets are issue #12's targets on the drains (item 2) and the
// relay processes (item 5).
func drainTargets(r *Report) []Target {
	rate := func(name string) float64 {
		if res := r.Result(name); res != nil && res.Err == "" {
			return res.MsgsPerSec
		}
		return -1
	}
	ratio := func(a, b string) float64 {
		x, y := rate(a), rate(b)
		if x <= 0 || y <= 0 {
			return -1
		}
		return x / y
	}
	var ts []Target
	if r.ran(RelayKeyName, RelayNoneName) {
		name := fmt.Sprintf("relay/key PostgreSQL CPU/msg ≤ %.2f × relay/none's", TargetKeyPGCPU)
		t := unmeasured(name, TargetKeyPGCPU, "×")
		if k, n := r.medianCPU(RelayKeyName), r.medianCPU(RelayNoneName); k != nil && n != nil && k.Postgres >= 0 && n.Postgres > 0 {
			t = atMost(name, k.Postgres/n.Postgres, TargetKeyPGCPU, "×")
		}
		ts = append(ts,
			t,
			atLeast(fmt.Sprintf("relay/key ≥ %.2f × relay/none", TargetKeyOverNone), ratio(RelayKeyName, RelayNoneName), TargetKeyOverNone, "×"),
		)
	}
	if r.ran(RelayKeyName, CeilingStoreName, CeilingBrokerName) {
		ts = append(ts, atLeast(fmt.Sprintf("relay/key ≥ %.2f × combined ceiling", TargetKeyOverCeiling), ratio(RelayKeyName, CeilingName), TargetKeyOverCeiling, "×"))
	}
	for _, n := range RelaysCounts[1:] {
		if r.ran(RelaysName(1), RelaysName(n)) {
			ts = append(ts, atLeast(fmt.Sprintf("%s ≥ relays/1", RelaysName(n)), ratio(RelaysName(n), RelaysName(1)), 1, "×"))
		}
	}
	for _, n := range RelaysCounts[1:] {
		if r.ran(RelaysName(1), RelaysName(n)) {
			name := fmt.Sprintf("%s CPU/msg (PostgreSQL + broker + relays) ≤ %.1f × relays/1's", RelaysName(n), TargetRelaysCPU)
			t := unmeasured(name, TargetRelaysCPU, "×")
			if one, many := machineCPU(r.medianCPU(RelaysName(1))), machineCPU(r.medianCPU(RelaysName(n))); one > 0 && many > 0 {
				t = atMost(name, many/one, TargetRelaysCPU, "×")
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// machineCPU is the CPU per message of PostgreSQL, the broker and the
// relay processes together (without the broker when it is not the bench's
// process: not measured), or -1 when PostgreSQL's or the relays' was not
// measured.
func machineCPU(c *ProcessCPU) float64 {
	if c == nil || c.Postgres < 0 || c.Relay < 0 {
		return -1
	}
	return c.Postgres + max(0, c.Broker) + c.Relay
}

// loadTargets are issue #12's targets on the steady and idle scenarios
// (item 3).
func loadTargets(r *Report) []Target {
	var ts []Target
	metric := func(l *Load, f func(*Load) float64) float64 {
		if l == nil {
			return -1
		}
		return f(l)
	}
	added := func(l *Load) float64 {
		if l.PostgresAddedMicros < 0 || l.PostgresAloneMicros <= 0 {
			return -1
		}
		return l.PostgresAddedMicros / l.PostgresAloneMicros
	}
	relayCPU := func(l *Load) float64 { return l.CPU.Relay }
	p99 := func(l *Load) float64 { return l.P99 }
	reach := func(l *Load) float64 { return l.Achieved / l.Rate }
	keyOverNone := func(what string, key, none string, f func(*Load) float64) Target {
		name := fmt.Sprintf("%s: %s within %.1f × %s", key, what, TargetKeyOverNoneLoad, none)
		k, n := metric(r.load(key), f), metric(r.load(none), f)
		if k < 0 || n <= 0 {
			return unmeasured(name, TargetKeyOverNoneLoad, "×")
		}
		return atMost(name, k/n, TargetKeyOverNoneLoad, "×")
	}
	addedPG := func(l *Load) float64 { return l.PostgresAddedMicros }
	for _, pair := range [][2]string{{SteadyKey1000Name, SteadyNone1000Name}, {SteadyKey5000Name, SteadyNone5000Name}} {
		key, none := pair[0], pair[1]
		// The ceiling runs after steady/key@RATE; it has no ordering, so
		// steady/none@RATE is held against the same one.
		var ceiling *Load
		if l := r.load(key); l != nil {
			ceiling = l.Ceiling
		}
		for _, name := range pair {
			if !r.ran(name) {
				continue
			}
			l := r.load(name)
			if name == SteadyKey1000Name || name == SteadyNone1000Name {
				ts = append(ts,
					withCeiling(atMost(name+": PostgreSQL CPU the relay adds ≤ 0.5 × the producers' own", metric(l, added), TargetAddedPGShare, "×"), metric(ceiling, added)),
					withCeiling(atMost(name+": relay CPU ≤ 40 µs/msg", metric(l, relayCPU), TargetRelayMicros, unitMicros), metric(ceiling, relayCPU)),
					withCeiling(atMost(name+": commit→receive p99 ≤ 10 ms", metric(l, p99), TargetP99At1000Ms, "ms"), metric(ceiling, p99)),
				)
				continue
			}
			ts = append(ts,
				atLeast(fmt.Sprintf("%s: producers reach the offered rate (≥ %.2f ×)", name, TargetReachShare), metric(l, reach), TargetReachShare, "×"),
				withCeiling(atMost(name+": commit→receive p99 ≤ 25 ms", metric(l, p99), TargetP99At5000Ms, "ms"), metric(ceiling, p99)),
			)
		}
		if r.ran(key) && r.ran(none) {
			ts = append(ts,
				keyOverNone("PostgreSQL CPU the relay adds", key, none, addedPG),
				keyOverNone("relay CPU/msg", key, none, relayCPU),
				keyOverNone("p99", key, none, p99),
			)
		}
	}
	if r.ran(IdleName) {
		l := r.load(IdleName)
		ts = append(ts,
			atMost("idle: relay CPU ≤ 1% of a core", metric(l, func(l *Load) float64 { return l.Core.Relay }), TargetIdleCorePct, unitPct),
			atMost("idle: ≤ 2 statements/s per relay", metric(l, func(l *Load) float64 { return l.RelayStatementsPerSec }), TargetIdleQPS, unitQPS),
		)
	}
	return ts
}

// targetText formats a target's measured value, with the ceiling's and
// the ratio to it when measured: "215.0 µs/msg (ceiling 95.0: 2.26 ×)".
func targetText(t Target) string {
	s := targetValue(t)
	if t.Ceiling > 0 && t.OverCeiling > 0 {
		s += fmt.Sprintf(" (ceiling %s: %.2f ×)", ceilingValue(t.Ceiling), t.OverCeiling)
	}
	return s
}

// ceilingValue is a ceiling's figure without its unit.
func ceilingValue(x float64) string {
	if x < 10 {
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.1f", x)
}

// targetValue formats a target's measured value alone.
func targetValue(t Target) string {
	switch t.Unit {
	case "ms":
		return fmt.Sprintf("%.1f ms", t.Got)
	case "×":
		return fmt.Sprintf("%.2f ×", t.Got)
	case unitPct:
		return fmt.Sprintf("%.2f%% of a core", t.Got)
	}
	return strings.TrimSpace(fmt.Sprintf("%.1f %s", t.Got, t.Unit))
}
