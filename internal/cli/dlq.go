package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Bounds of `outbox dlq list --limit`.
const (
	DLQListLimitDefault = 100
	DLQListLimitMax     = 10000
)

// dlqFlags are the flags shared by the dlq subcommands.
type dlqFlags struct {
	store     storeFlags
	topic     string
	ids       []string
	olderThan time.Duration
	asJSON    bool
	timeout   time.Duration
}

func newDLQCommand(a *app) *cobra.Command {
	var f dlqFlags
	cmd := &cobra.Command{
		Use:   "dlq list|show|requeue|purge --store URL [filters]",
		Short: "List, show, requeue or purge dead letters",
		Long: `dlq works on the dead letters: messages the relay gave up on (a permanent
broker error, or --max-attempts failures), kept with their last error.

Filters, combined with AND: --topic, --id (repeatable or comma-separated),
--older-than (failed longer ago than this). Without filters a subcommand acts
on every dead letter; purge then asks for --yes, because it deletes for good.
requeue puts messages back into the outbox, after every message of their key
already waiting, with their attempts reset.`,
		Example: `  outbox dlq list --store postgres://app@localhost:5432/app --topic orders.created
  outbox dlq show --store … 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d
  outbox dlq requeue --store … --id 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d
  outbox dlq purge --store … --older-than 168h`,
		// Without a known subcommand: a usage error, not help and exit 0.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown subcommand %q: use list, show, requeue or purge", args[0])
			}
			return usagef("needs a subcommand: list, show, requeue or purge (see %s --help)", cmd.CommandPath())
		},
	}
	pf := cmd.PersistentFlags()
	f.store.add(pf, storeFlagSet{})
	pf.StringVar(&f.topic, "topic", "", "only dead letters of this topic")
	pf.StringSliceVar(&f.ids, "id", nil, "only dead letters with this message ID (repeat the flag or separate with commas)")
	pf.DurationVar(&f.olderThan, "older-than", 0, "only dead letters that failed longer ago than this, such as 1h")
	pf.BoolVar(&f.asJSON, "json", false, "print JSON instead of text")
	timeoutFlag(pf, &f.timeout)

	cmd.AddCommand(newDLQListCommand(a, &f), newDLQShowCommand(a, &f), newDLQRequeueCommand(a, &f), newDLQPurgeCommand(a, &f))
	return cmd
}

// filter checks the filter flags and returns the store filter and whether
// any filter was given.
func (a *app) dlqFilter(cmd *cobra.Command, f *dlqFlags) (outbox.DeadLetterFilter, bool, error) {
	var flt outbox.DeadLetterFilter
	given := false
	if f.topic != "" {
		if err := outbox.ValidateTopic(f.topic); err != nil {
			return flt, false, usagef("%s %v", a.flagRef("topic"), err)
		}
		flt.Topic, given = f.topic, true
	}
	for _, id := range f.ids {
		id = strings.TrimSpace(id)
		if err := outbox.ValidateID(id); err != nil {
			return flt, false, usagef("%s: %v", a.flagRef("id"), err)
		}
		flt.IDs, given = append(flt.IDs, id), true
	}
	if cmd.Flags().Changed("older-than") || f.olderThan != 0 {
		if f.olderThan <= 0 {
			return flt, false, usagef("%s must be positive, such as 1h, got %v", a.flagRef("older-than"), f.olderThan)
		}
		flt.FailedBefore, given = a.env.Now().Add(-f.olderThan), true
	}
	return flt, given, nil
}

func newDLQListCommand(a *app, f *dlqFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest failure first",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().IntVar(&limit, "limit", DLQListLimitDefault, "list at most this many")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		flt, _, err := a.dlqFilter(cmd, f)
		if err != nil {
			return err
		}
		if err := a.between("limit", limit, 1, DLQListLimitMax); err != nil {
			return err
		}
		flt.Limit = limit
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
			return fmt.Errorf("list dead letters: %w", err)
		}
		if f.asJSON {
			return writeDeadLettersJSON(a.env.Stdout, dls)
		}
		return writeDeadLettersText(a.env.Stdout, dls, a.env.Now())
	})
	return cmd
}

func newDLQRequeueCommand(a *app, f *dlqFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "requeue",
		Short: "Move dead letters back into the outbox to be published again",
		Args:  cobra.NoArgs,
	}
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		flt, _, err := a.dlqFilter(cmd, f)
		if err != nil {
			return err
		}
		return a.dlqAction(ctx, f, "requeued", func(ctx context.Context, d outbox.AdminStore) (int64, error) {
			n, err := d.Requeue(ctx, flt)
			if errors.Is(err, postgres.ErrWALCaptured) {
				// The wrong capture mode for this outbox: the user's flag.
				return n, usagef("%v", err)
			}
			return n, err
		})
	})
	return cmd
}

func newDLQPurgeCommand(a *app, f *dlqFlags) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters for good (without filters, only with --yes)",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm deleting every dead letter when no filter is given (never read from the environment)")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		flt, given, err := a.dlqFilter(cmd, f)
		if err != nil {
			return err
		}
		if !given && !yes {
			return usagef("without --topic, --id or --older-than, purge deletes every dead letter: add --yes to confirm, or give a filter")
		}
		return a.dlqAction(ctx, f, "purged", func(ctx context.Context, d outbox.AdminStore) (int64, error) {
			return d.PurgeDeadLetters(ctx, flt)
		})
	})
	return cmd
}

// dlqAction opens the store, runs op on its dead letters within --timeout,
// logs and prints how many were affected ("requeued", "purged").
func (a *app) dlqAction(ctx context.Context, f *dlqFlags, verb string, op func(context.Context, outbox.AdminStore) (int64, error)) error {
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
	n, err := op(ctx, d)
	if err != nil {
		return fmt.Errorf("%s dead letters: %w", strings.TrimSuffix(verb, "d"), err)
	}
	a.log.Info(verb+" dead letters", "count", n)
	return writeCount(a.env.Stdout, f.asJSON, verb, n)
}

func writeCount(w io.Writer, asJSON bool, verb string, n int64) error {
	if asJSON {
		return json.NewEncoder(w).Encode(map[string]int64{verb: n})
	}
	noun := "dead letters"
	if n == 1 {
		noun = "dead letter"
	}
	_, err := fmt.Fprintf(w, "%s %d %s\n", verb, n, noun)
	return err
}

// deadLetterJSON is the --json form of a dead letter. The payload is
// inlined when it is valid JSON ("payload"), and base64 otherwise
// ("payload_base64").
type deadLetterJSON struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	FailedAt      time.Time         `json:"failed_at"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
}

func writeDeadLettersJSON(w io.Writer, dls []outbox.DeadLetter) error {
	out := make([]deadLetterJSON, 0, len(dls))
	for _, d := range dls {
		j := deadLetterJSON{
			ID: d.ID, Topic: d.Topic, Key: d.Key, Headers: d.Headers, CreatedAt: d.CreatedAt.UTC(),
			Attempts: d.Attempts, LastError: d.LastError, FailedAt: d.FailedAt.UTC(),
		}
		if len(d.Payload) > 0 && json.Valid(d.Payload) {
			j.Payload = json.RawMessage(d.Payload)
		} else if len(d.Payload) > 0 {
			j.PayloadBase64 = d.Payload
		}
		out = append(out, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// lastErrorWidth bounds the LAST ERROR column of the text table.
const lastErrorWidth = 80

func writeDeadLettersText(w io.Writer, dls []outbox.DeadLetter, now time.Time) error {
	if len(dls) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID\tTOPIC\tKEY\tATTEMPTS\tFAILED\tLAST ERROR\n")
	for _, d := range dls {
		key := d.Key
		if key == "" {
			key = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\t%s\n", d.ID, d.Topic, oneLine(key, 32), d.Attempts, age(now.Sub(d.FailedAt)), oneLine(d.LastError, lastErrorWidth))
	}
	return tw.Flush()
}

// oneLine flattens s to one line of at most n runes, for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
