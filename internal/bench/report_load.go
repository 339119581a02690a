package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// cpuText formats µs per message (or a percentage), "-" when not measured.
func cpuText(x float64) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", x)
}

// cpuCols are the PostgreSQL, broker and relay columns of a drain row.
func cpuCols(c *ProcessCPU) (pg, broker, relay string) {
	if c == nil {
		return "-", "-", "-"
	}
	return cpuText(c.Postgres), cpuText(c.Broker), cpuText(c.Relay)
}

// relaysTable compares 1, 2 and 3 relay processes draining one backlog.
func (r *Report) relaysTable() (string, []string) {
	var rows []*Result
	for _, n := range RelaysCounts {
		if res := r.Result(RelaysName(n)); res != nil {
			rows = append(rows, res)
		}
	}
	if len(rows) == 0 {
		return "", nil
	}
	var failures []string
	one := r.Result(RelaysName(1))
	var b strings.Builder
	fmt.Fprintf(&b, "\nrelay processes [%s database]: N `outbox relay` processes (ordering key, %d workers each) running when one backlog commits (started on an empty outbox, waited for until they share the partitions; timed from the commit); share of the messages each published (its /metrics), median run\n", r.DB, rows[0].Workers)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tMESSAGES\tMSGS/S (MEDIAN)\tMIN–MAX\t× RELAYS/1\tSHARES\tCPU µs/MSG PG\tBROKER\tRELAYS")
	for _, res := range rows {
		if res.Err != "" {
			fmt.Fprintf(tw, "%s\t%s\tFAILED\n", res.Scenario, thousands(float64(res.Messages)))
			failures = append(failures, res.Scenario+": "+res.Err)
			continue
		}
		ratio := ""
		if one != nil && one.MsgsPerSec > 0 {
			ratio = ratioText(res.MsgsPerSec / one.MsgsPerSec)
		}
		shares := "-"
		if run := res.medianRun(); run != nil && len(run.RelayShares) > 0 {
			var ss []string
			for _, s := range run.RelayShares {
				ss = append(ss, fmt.Sprintf("%.0f%%", 100*s))
			}
			shares = strings.Join(ss, "/")
		}
		pg, br, rl := cpuCols(r.medianCPU(res.Scenario))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s–%s\t%s\t%s\t%s\t%s\t%s\n", res.Scenario, thousands(float64(res.Messages)), thousands(res.MsgsPerSec),
			thousands(res.Min), thousands(res.Max), ratio, shares, pg, br, rl)
	}
	_ = tw.Flush()
	return b.String(), failures
}

// loadTable shows the steady/ORDERING@RATE and idle scenarios.
func (r *Report) loadTable() (string, []string) {
	var rows []*Result
	for _, n := range LoadScenarioNames() {
		if n == HorizonFreeName || n == HorizonHeldName {
			continue // horizonTable
		}
		if res := r.Result(n); res != nil {
			rows = append(rows, res)
		}
	}
	if len(rows) == 0 {
		return "", nil
	}
	var failures []string
	o := r.Options
	var b strings.Builder
	fmt.Fprintf(&b, "\nsteady load [%s database]: %d producers (the bench's process) commit %d messages per transaction at the offered rate for %gs after a %gs warm-up, first alone, then with one `outbox relay` process (%d workers, batch %d)\n",
		r.DB, SteadyProducers, SteadyPerTx, o.SteadyDuration.Seconds(), o.SteadyWarmup.Seconds(), rows[0].Workers, rows[0].Batch)
	consumer := "the bench's consumer"
	if l := rows[0].Load; l != nil && l.Consumer != "" {
		consumer = l.Consumer
	}
	fmt.Fprintf(&b, "latency: commit→receive, from the producer's Commit returning to %s (its own connection) receiving the message; ROUTED P99: commit→routed, to a core subscription on the stream's subjects (as the broker routes the relay's publish, before the stream stores it)\n", consumer)
	b.WriteString("CPU: % of one core over the measured span (PG alone: PostgreSQL with the producers alone); PG ADDED: PostgreSQL CPU µs/msg the relay adds (with the relay minus alone); RELAY STMTS/S: every statement's calls with the relay minus alone (pg_stat_statements)\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tOFFERED\tACHIEVED\tALONE\tP50 MS\tP99 MS\tMAX MS\tROUTED P99\tPG %\tPG ALONE %\tBROKER %\tRELAY %\tPRODUCERS %\tPG µs/MSG ALONE\tPG ADDED\tRELAY µs/MSG\tRELAY STMTS/S")
	var idle *Result
	ceilings := 0
	for _, res := range rows {
		if res.Scenario == IdleName {
			idle = res
			continue
		}
		if res.Err != "" {
			fmt.Fprintf(tw, "%s\tFAILED\n", res.Scenario)
			failures = append(failures, res.Scenario+": "+res.Err)
			continue
		}
		loadRow(tw, res.Scenario, res.Load)
		if c := res.Load.Ceiling; c != nil {
			loadRow(tw, SteadyCeilingName(int(c.Rate)), c)
			ceilings++
		}
	}
	_ = tw.Flush()
	if ceilings > 0 {
		fmt.Fprintf(&b, "ceiling/steady@RATE: run right after steady/key@RATE at the same rate, against the same producers alone: instead of `outbox relay`, a process of its own (`outbox bench steady-ceiling`) doing the bare minimum in one goroutine on one connection: LISTEN; on each notification one SELECT of the notified partitions above per-partition cursors and one Publish of the rows with the broker's confirmations; one DELETE of the published IDs every %v (as the relay settles); no leases, no per-key order, no metrics. RELAY columns: that process\n", CeilingSettleEvery)
	}
	if idle != nil {
		if idle.Err != "" {
			b.WriteString("idle: FAILED\n")
			failures = append(failures, idle.Scenario+": "+idle.Err)
		} else {
			l := idle.Load
			fmt.Fprintf(&b, "idle: one `outbox relay` process (ordering key), empty outbox, %.0fs: relay %s%% of a core, PostgreSQL %s%%, broker %s%%, %s statements/s\n",
				l.Seconds, cpuText(l.Core.Relay), cpuText(l.Core.Postgres), cpuText(l.Core.Broker), cpuText(l.RelayStatementsPerSec))
		}
	}
	return b.String(), failures
}

// loadRow prints one row of the steady load table.
func loadRow(tw io.Writer, name string, l *Load) {
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name,
		thousands(l.Rate), thousands(l.Achieved), thousands(l.AchievedAlone), l.P50, l.P99, l.Max, l.RoutedP99,
		cpuText(l.Core.Postgres), cpuText(l.Alone.Postgres), cpuText(l.Core.Broker), cpuText(l.Core.Relay), cpuText(l.Core.Producers),
		cpuText(l.PostgresAloneMicros), cpuText(l.PostgresAddedMicros), cpuText(l.CPU.Relay), cpuText(l.RelayStatementsPerSec))
}

// statementsText lists each scenario's top statements by total time
// (pg_stat_statements over the timed span of its median run).
func (r *Report) statementsText() string {
	var b strings.Builder
	for _, res := range r.Results {
		var stmts []Statement
		if res.Load != nil {
			stmts = res.Load.Statements
		} else if run := res.medianRun(); run != nil {
			stmts = run.Statements
		}
		r.statementsOf(&b, res.Scenario, stmts)
		if res.Load != nil && res.Load.Ceiling != nil {
			r.statementsOf(&b, SteadyCeilingName(int(res.Load.Ceiling.Rate)), res.Load.Ceiling.Statements)
		}
	}
	return b.String()
}

// statementsOf prints one scenario's top statements, if any.
func (r *Report) statementsOf(b *strings.Builder, name string, stmts []Statement) {
	if len(stmts) == 0 {
		return
	}
	fmt.Fprintf(b, "\nstatements of %s [%s database] (pg_stat_statements over the timed span, by total time)\n", name, r.DB)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALLS\tTOTAL MS\tROWS\tµs/MSG\tPLANS\tPLAN MS\tQUERY")
	for _, s := range stmts {
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%.2f\t%s\t%.1f\t%s\n", thousands(float64(s.Calls)), s.TotalMs, thousands(float64(s.Rows)), s.MicrosPerMsg, thousands(float64(s.Plans)), s.PlanMs, s.Query)
	}
	_ = tw.Flush()
}
