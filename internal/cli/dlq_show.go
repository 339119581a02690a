package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
)

// newDLQShowCommand is `outbox dlq show ID…`: every field of the dead
// letters named, the whole last error, headers and payload, where list
// shows one line each. --json prints the same objects as list --json.
func newDLQShowCommand(a *app, f *dlqFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show ID [ID...]",
		Short: "Show dead letters in full: last error, headers, payload",
		Example: `  outbox dlq show --store postgres://app@localhost:5432/app 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d
  outbox dlq show --store … --json 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d`,
		Args: cobra.ArbitraryArgs,
	}
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		ids := append(slices.Clone(f.ids), args...)
		if len(ids) == 0 {
			return usagef("give the ID of a dead letter, such as outbox dlq show --store … 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d (outbox dlq list shows the IDs)")
		}
		f.ids = ids
		flt, _, err := a.dlqFilter(cmd, f)
		if err != nil {
			return err
		}
		flt.Limit = len(flt.IDs)
		ctx, cancel, err := a.withTimeout(ctx, f.timeout)
		if err != nil {
			return err
		}
		defer cancel()
		s, d, err := f.store.openAdmin(ctx, a, "dlq")
		if err != nil {
			return err
		}
		defer a.closeStore(s)
		dls, err := d.DeadLetters(ctx, flt)
		if err != nil {
			return fmt.Errorf("read dead letters: %w", err)
		}
		found := map[string]bool{}
		for _, dl := range dls {
			found[dl.ID] = true
		}
		var missing []string
		for _, id := range flt.IDs {
			if !found[id] {
				missing = append(missing, id)
			}
		}
		if f.asJSON {
			if err := writeDeadLettersJSON(a.env.Stdout, dls); err != nil {
				return err
			}
		} else if err := writeDeadLettersFull(a.env.Stdout, dls, a.env.Now()); err != nil {
			return err
		}
		if len(missing) > 0 {
			what := "no dead letter with ID " + strings.Join(missing, ", ")
			if f.topic != "" {
				what += " in topic " + f.topic
			}
			return fmt.Errorf("%s (a message still waiting is not a dead letter: outbox console shows it)", what)
		}
		return nil
	})
	return cmd
}

// writeDeadLettersFull prints each dead letter as a block of fields.
func writeDeadLettersFull(w io.Writer, dls []outbox.DeadLetter, now time.Time) error {
	for i, d := range dls {
		if i > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		key := d.Key
		if key == "" {
			key = "-"
		}
		fmt.Fprintf(tw, "ID\t%s\n", d.ID)
		fmt.Fprintf(tw, "Topic\t%s\n", d.Topic)
		fmt.Fprintf(tw, "Key\t%s\n", key)
		fmt.Fprintf(tw, "Created\t%s (%s ago)\n", d.CreatedAt.UTC().Format(time.RFC3339), age(now.Sub(d.CreatedAt)))
		fmt.Fprintf(tw, "Failed\t%s (%s ago)\n", d.FailedAt.UTC().Format(time.RFC3339), age(now.Sub(d.FailedAt)))
		fmt.Fprintf(tw, "Attempts\t%d\n", d.Attempts)
		fmt.Fprintf(tw, "Last error\t%s\n", oneLine(d.LastError, 1<<20))
		for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
			fmt.Fprintf(tw, "Header\t%s: %s\n", k, oneLine(d.Headers[k], 1<<16))
		}
		switch {
		case len(d.Payload) == 0:
			fmt.Fprintf(tw, "Payload\t(empty)\n")
		case utf8.Valid(d.Payload):
			fmt.Fprintf(tw, "Payload\t%d bytes\n", len(d.Payload))
		default:
			fmt.Fprintf(tw, "Payload\t%d bytes, base64 below\n", len(d.Payload))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(d.Payload) > 0 {
			p := string(d.Payload)
			if !utf8.Valid(d.Payload) {
				p = base64.StdEncoding.EncodeToString(d.Payload)
			}
			if _, err := fmt.Fprintf(w, "%s\n", strings.TrimRight(p, "\n")); err != nil {
				return err
			}
		}
	}
	return nil
}
