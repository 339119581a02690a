package bench

import (
	"fmt"
	"strings"
	"text/tabwriter"
)

// horizonTable shows horizon/free@2000 and horizon/held@2000 side by
// side, with the held run's ratio to the free one.
func (r *Report) horizonTable() (string, []string) {
	free, held := r.Result(HorizonFreeName), r.Result(HorizonHeldName)
	if free == nil && held == nil {
		var failures []string
		return r.horizonWALText(&failures), failures
	}
	o := r.Options
	var (
		b        strings.Builder
		failures []string
	)
	fmt.Fprintf(&b, "\nxmin horizon [%s database%s]: steady/key@2000 (%d producers, %d messages per transaction, %gs after a %gs warm-up, one `outbox relay` process), free, and held by one idle transaction holding a transaction ID through the run with the relay\n",
		r.DB, layoutNote(o.Layout), SteadyProducers, SteadyPerTx, o.SteadyDuration.Seconds(), o.SteadyWarmup.Seconds())
	b.WriteString("PG µs/MSG: PostgreSQL CPU per message with the relay (producers' and relay's work); PG ADDED: the part the relay adds; DEAD TUPLES: the outbox table's n_dead_tup once every message was received\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tACHIEVED\tP50 MS\tP99 MS\tMAX MS\tPG µs/MSG\tPG ADDED\tRELAY µs/MSG\tFETCH MEAN MS\tSETTLE MEAN MS\tDEAD TUPLES")
	ok := func(res *Result) bool {
		if res == nil {
			return false
		}
		if res.Err != "" {
			fmt.Fprintf(tw, "%s\tFAILED\n", res.Scenario)
			failures = append(failures, res.Scenario+": "+res.Err)
			return false
		}
		l := res.Load
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%.2f\t%.2f\t%s\n", res.Scenario, thousands(l.Achieved), l.P50, l.P99, l.Max,
			cpuText(l.CPU.Postgres), cpuText(l.PostgresAddedMicros), cpuText(l.CPU.Relay), l.FetchMeanMs, l.SettleMeanMs, thousands(float64(l.DeadTuples)))
		return true
	}
	freeOK, heldOK := ok(free), ok(held)
	if freeOK && heldOK {
		f, h := free.Load, held.Load
		x := func(h, f float64) string {
			if f <= 0 || h < 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f×", h/f)
		}
		fmt.Fprintf(tw, "held ÷ free\t\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x(h.P50, f.P50), x(h.P99, f.P99), x(h.Max, f.Max),
			x(h.CPU.Postgres, f.CPU.Postgres), x(h.PostgresAddedMicros, f.PostgresAddedMicros), x(h.CPU.Relay, f.CPU.Relay),
			x(h.FetchMeanMs, f.FetchMeanMs), x(h.SettleMeanMs, f.SettleMeanMs), x(float64(h.DeadTuples), float64(f.DeadTuples)))
	}
	_ = tw.Flush()
	b.WriteString(r.horizonWALText(&failures))
	return b.String(), failures
}

// horizonWALText shows horizon/wal-free@2000 and horizon/wal-held@2000
// side by side.
func (r *Report) horizonWALText(failures *[]string) string {
	free, held := r.Result(HorizonWALFreeName), r.Result(HorizonWALHeldName)
	if free == nil && held == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("capture wal, the same load (relay/wal in the bench's process; commit→ack, from the producer's Commit returning to the relay's Publish returning: not comparable with the commit→receive above, only free with held)\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tACHIEVED\tP50 MS\tP99 MS\tMAX MS\tPG µs/MSG\tBENCH µs/MSG")
	var ls []*Latency
	for _, res := range []*Result{free, held} {
		if res == nil {
			continue
		}
		if res.Err != "" || res.Latency == nil {
			fmt.Fprintf(tw, "%s\tFAILED\n", res.Scenario)
			*failures = append(*failures, res.Scenario+": "+res.Err)
			continue
		}
		l := res.Latency
		ls = append(ls, l)
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\n", res.Scenario, thousands(l.Achieved), l.P50, l.P99, l.Max, cpuText(l.ServerCPUMicros), cpuText(l.ClientCPUMicros))
	}
	if len(ls) == 2 {
		f, h := ls[0], ls[1]
		x := func(h, f float64) string {
			if f <= 0 || h < 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f×", h/f)
		}
		fmt.Fprintf(tw, "held ÷ free\t\t%s\t%s\t%s\t%s\t%s\n", x(h.P50, f.P50), x(h.P99, f.P99), x(h.Max, f.Max), x(h.ServerCPUMicros, f.ServerCPUMicros), x(h.ClientCPUMicros, f.ClientCPUMicros))
	}
	_ = tw.Flush()
	return b.String()
}
