package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/health"
)

func newStatusCommand(a *app) *cobra.Command {
	var (
		sf      storeFlags
		asJSON  bool
		timeout time.Duration
		relays  []string
	)
	cmd := &cobra.Command{
		Use:   "status --store URL [--json]",
		Short: "Show the backlog, dead letters and live relays of an outbox",
		Long: `status shows how many messages wait in the outbox and how old the oldest one
is, the backlog per topic and per partition (partitions with no backlog are
left out of the table; --json lists them all), the dead-letter count, and the
live relays with the partitions they lease.

Blocked destinations (a deleted stream, a missing topic, an unroutable
exchange: paused by a relay, spending no attempts) are known only to the
running relays: give each relay's --http-addr with --relay to list them
(status reads its /readyz).`,
		Example: `  outbox status --store postgres://app@localhost:5432/app
  outbox status --store postgres://app@localhost:5432/app --relay 10.0.0.5:7467 --relay 10.0.0.6:7467`,
		Args: cobra.NoArgs,
	}
	sf.add(cmd.Flags(), storeFlagSet{})
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of tables")
	cmd.Flags().StringArrayVar(&relays, "relay", nil, "a relay's --http-addr (host:port or http://host:port), to list its blocked destinations and readiness; repeat for each relay")
	timeoutFlag(cmd.Flags(), &timeout)
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		ctx, cancel, err := a.withTimeout(ctx, timeout)
		if err != nil {
			return err
		}
		defer cancel()
		s, as, err := sf.openAdmin(ctx, a, "status")
		if err != nil {
			return err
		}
		defer a.closeStore(s)
		st, err := as.Status(ctx)
		if err != nil {
			return fmt.Errorf("read status: %w", err)
		}
		live, err := readRelays(ctx, relays)
		if err != nil {
			return err
		}
		now := a.env.Now()
		if asJSON {
			return writeStatusJSON(a.env.Stdout, st, live, now)
		}
		if err := writeStatusText(a.env.Stdout, st, now); err != nil {
			return err
		}
		return writeRelaysText(a.env.Stdout, live, now)
	})
	return cmd
}

// storeScheme returns the scheme of a store URL already accepted by
// backends.OpenStore.
func storeScheme(rawURL string) string {
	for i := 0; i < len(rawURL); i++ {
		if rawURL[i] == ':' {
			return rawURL[:i]
		}
	}
	return rawURL
}

// statusJSON is the --json form of a status: outbox.Status plus the age of
// the oldest message.
type statusJSON struct {
	*outbox.Status
	OldestAgeSeconds float64     `json:"oldest_age_seconds"`
	At               time.Time   `json:"at"`
	LiveRelays       []relayLive `json:"live_relays,omitempty"`
}

func writeStatusJSON(w io.Writer, st *outbox.Status, live []relayLive, now time.Time) error {
	out := statusJSON{Status: st, At: now.UTC(), LiveRelays: live}
	if !st.OldestCreatedAt.IsZero() {
		out.OldestAgeSeconds = max(0, now.Sub(st.OldestCreatedAt).Seconds())
	}
	// Empty lists as [] rather than null.
	if st.Topics == nil {
		st.Topics = []outbox.TopicCount{}
	}
	if st.Partitions == nil {
		st.Partitions = []outbox.PartitionStatus{}
	}
	if st.Relays == nil {
		st.Relays = []outbox.RelayStatus{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeStatusText(w io.Writer, st *outbox.Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if st.Slot != nil && !st.Slot.Held {
		fmt.Fprintf(tw, "outstanding\t- (capture wal: messages wait in the replication slot; see its lag)\n")
	} else {
		fmt.Fprintf(tw, "outstanding\t%d\n", st.Outstanding)
	}
	if st.OldestCreatedAt.IsZero() {
		fmt.Fprintf(tw, "oldest\t-\n")
	} else {
		fmt.Fprintf(tw, "oldest\t%s (written %s)\n", age(now.Sub(st.OldestCreatedAt)), st.OldestCreatedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "dead letters\t%d\n", st.DeadLetters)
	if st.Slot != nil && !st.Slot.Held {
		state := "none streams from the slot"
		if st.Slot.Active {
			state = "one streams from the slot (the others stand by)"
		}
		fmt.Fprintf(tw, "live relays\t- (capture wal: %s; see below)\n", state)
	} else {
		fmt.Fprintf(tw, "live relays\t%d\n", len(st.Relays))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.Slot != nil {
		if err := writeSlotText(w, st.Slot); err != nil {
			return err
		}
	}
	if st.XminHorizon != nil {
		if err := writeHorizonText(w, st.XminHorizon); err != nil {
			return err
		}
	}

	if len(st.Topics) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "TOPIC\tOUTSTANDING\n")
		for _, t := range st.Topics {
			fmt.Fprintf(tw, "%s\t%d\n", t.Topic, t.Count)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	var backlog []outbox.PartitionStatus
	for _, p := range st.Partitions {
		if p.Outstanding > 0 {
			backlog = append(backlog, p)
		}
	}
	if len(backlog) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "PARTITION\tOUTSTANDING\tOWNER\tEPOCH\tLEASE EXPIRES IN\n")
		for _, p := range backlog {
			owner, expires := "-", "-"
			if p.Owner != "" {
				owner = p.Owner
				expires = age(p.LeaseExpiresAt.Sub(now))
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\n", p.Partition, p.Outstanding, owner, p.Epoch, expires)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if n := len(st.Partitions) - len(backlog); n > 0 {
			fmt.Fprintf(w, "(%d partitions without backlog not shown; --json lists all)\n", n)
		}
	}

	if len(st.Relays) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "RELAY\tPARTITIONS\tEXPIRES IN\n")
		for _, r := range st.Relays {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", r.Node, r.Partitions, age(r.ExpiresAt.Sub(now)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(st.Requests) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "OPERATION\tREQUESTS\tERRORS\tCAPACITY UNITS\n")
		for _, op := range slices.Sorted(maps.Keys(st.Requests)) {
			r := st.Requests[op]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\n", op, r.Requests, r.Errors, r.ConsumedCapacity)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// writeSlotText prints the replication slot of capture wal.
func writeSlotText(w io.Writer, sl *outbox.SlotStatus) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := "not streamed (no relay holds it)"
	switch {
	case !sl.Exists:
		state = "missing (run outbox migrate --capture wal)"
	case sl.Held:
		state = "streamed by this process"
	case sl.Active:
		state = fmt.Sprintf("streamed by a relay (server pid %d)", sl.ActivePID)
	}
	fmt.Fprintf(tw, "replication slot\t%s: %s\n", sl.Name, state)
	if sl.Exists {
		fmt.Fprintf(tw, "wal status\t%s\n", sl.WALStatus)
		fmt.Fprintf(tw, "confirmed up to\t%s\n", sl.ConfirmedLSN)
		lag := bytesText(sl.LagBytes)
		if sl.LagSeconds != nil {
			lag += fmt.Sprintf(", %s", age(time.Duration(*sl.LagSeconds*float64(time.Second))))
		}
		fmt.Fprintf(tw, "lag\t%s\n", lag)
		if sl.SafeWALBytes != nil {
			fmt.Fprintf(tw, "WAL before invalidation\t%s (max_slot_wal_keep_size)\n", bytesText(*sl.SafeWALBytes))
		}
		if sl.Parked > 0 {
			fmt.Fprintf(tw, "parked\t%d messages: the relay's buffer was full with nothing published (a blocked destination, keys waiting for their retries); they wait in the parked table and go out, in order, once their destination works\n", sl.Parked)
		}
	}
	if sl.Error != "" {
		fmt.Fprintf(tw, "ERROR\t%s\n", sl.Error)
	}
	return tw.Flush()
}

// bytesText formats a byte count for a person.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB (%d bytes)", v, "KMGTP"[i], n)
}

// age formats a duration for a table: rounded to what a person reads.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "expired"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// relayLive is what a relay's /readyz said, for --relay.
type relayLive struct {
	URL string `json:"url"`
	health.Report
}

// readRelays reads the /readyz report of each relay address (a 503 report
// is read too: it says what is down). An address that does not answer is
// an error naming it.
func readRelays(ctx context.Context, addrs []string) ([]relayLive, error) {
	var out []relayLive
	for _, addr := range addrs {
		u := addr
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		u = strings.TrimSuffix(u, "/") + "/readyz"
		if _, err := url.ParseRequestURI(u); err != nil {
			return nil, usagef("--relay %q is not an address: give the relay's --http-addr, such as 127.0.0.1:7467", addr)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, usagef("--relay %q: %v", addr, err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("--relay %s: %w (is the relay running with --http-addr there?)", addr, err)
		}
		var rep health.Report
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&rep)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("--relay %s: %s answered %s without a readiness report: %v", addr, u, resp.Status, err)
		}
		out = append(out, relayLive{URL: u, Report: rep})
	}
	return out, nil
}

// writeRelaysText prints the relays' readiness and blocked destinations.
func writeRelaysText(w io.Writer, live []relayLive, now time.Time) error {
	if len(live) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RELAY (--relay)\tREADY\tSTORE\tBROKER\tBLOCKED DESTINATIONS\n")
	blocked := false
	for _, r := range live {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%d\n", r.URL, r.Ready, r.Store.Status, r.Broker.Status, len(r.Blocked))
		blocked = blocked || len(r.Blocked) > 0
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !blocked {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "BLOCKED DESTINATION\tRELAY\tFOR\tPROBES\tLAST ERROR\n")
	for _, r := range live {
		for _, b := range r.Blocked {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", b.Destination, r.URL, age(now.Sub(b.Since)), b.Probes, b.LastError)
		}
	}
	return tw.Flush()
}
