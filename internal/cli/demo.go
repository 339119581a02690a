//go:build !outbox_slim

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/demo"
)

func newDemoCommand(a *app) *cobra.Command {
	var (
		o          demo.Options
		asJSON     bool
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run an order service through the outbox and show what arrives (no servers needed)",
		Long: `demo runs a small order service that writes orders and their events in one
transaction, a relay that drains them to the broker, and a consumer that
applies them idempotently and checks per-customer order. It ends with a
summary: orders, messages published and consumed, duplicates, order
violations, throughput and latency, and whether the run placed orders at the
requested --rate and kept the p99 latency within 50 ms. A run that could not
says so, with the rate it reached ("fell short: 840 of 1,000 orders/s
requested"): the store, the relay or a busy machine could not keep up.

By default it needs nothing but this binary: the store is SQLite in a
temporary directory and the broker an embedded NATS server. --store
postgres://… and --broker nats://… use real servers instead (the demo works in
its own schema and stream and removes them at the end).

Progress is redrawn on one line on a terminal and printed every second
otherwise. With --json the progress and summary go to stderr and the summary
as JSON to stdout. Ctrl-C ends the run early and still prints the summary.
The command exits 1 if any message arrived out of order.`,
		Example: `  outbox demo
  outbox demo --duration 30s --rate 5000 --workers 8
  outbox demo --store postgres://postgres@localhost:5432/app --broker nats://localhost:4222`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Store, "store", "", "postgres:// URL of the outbox database (default: embedded SQLite in a temporary directory)")
	fs.StringVar(&o.Broker, "broker", "", "nats:// URL of a NATS server with JetStream (default: an embedded server)")
	fs.DurationVar(&o.Duration, "duration", demo.DurationDefault, "how long orders are placed")
	fs.IntVar(&o.Rate, "rate", demo.RateDefault, "orders per second, all producers together (0: as fast as possible); each order writes 3 messages")
	fs.IntVar(&o.Keys, "keys", demo.KeysDefault, "customers, the messages' keys")
	fs.IntVar(&o.Producers, "producers", demo.ProducersDefault, "goroutines placing orders")
	fs.IntVar(&o.Workers, "workers", demo.WorkersDefault, "relay workers")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON on stdout (progress goes to stderr)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof -top FILE)")

	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if err := a.checkDemo(o); err != nil {
			return err
		}
		o.Logger = a.log
		o.Out = a.env.Stdout
		if asJSON {
			o.Out = a.env.Stderr
		}
		o.Terminal = a.env.IsTerminal(o.Out)
		if o.Terminal && a.env.Logger == nil {
			// The progress is a line redrawn in place: a log line must
			// clear it first, or the two run into each other.
			a.env.Stderr = lineClearer{a.env.Stderr}
			log, err := a.buildLogger()
			if err != nil {
				return err
			}
			o.Logger = log
		}
		stopProfile, err := a.startCPUProfile(cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
		sum, err := demo.Run(ctx, o)
		if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() != nil) {
			return err
		}
		if asJSON {
			enc := json.NewEncoder(a.env.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(sum); err != nil {
				return err
			}
		}
		if sum.OrderViolations > 0 {
			return fmt.Errorf("%d messages were first delivered out of per-key order", sum.OrderViolations)
		}
		return nil
	})
	return cmd
}

var demoFieldRe = regexp.MustCompile(`^demo: ([A-Za-z]+) `)

// checkDemo checks the demo flags, naming the flag in its errors.
func (a *app) checkDemo(o demo.Options) error {
	if err := a.positiveDuration("duration", o.Duration); err != nil {
		return err
	}
	if o.Rate < 0 {
		return usagef("%s must be 0 (as fast as possible) or a positive number of orders per second, got %d", a.flagRef("rate"), o.Rate)
	}
	if err := a.between("keys", o.Keys, 1, demo.KeysMax); err != nil {
		return err
	}
	if err := a.between("producers", o.Producers, 1, demo.ProducersMax); err != nil {
		return err
	}
	if err := a.between("workers", o.Workers, 1, outbox.WorkersMax); err != nil {
		return err
	}
	if o.Store != "" {
		if err := backends.CheckStoreURL(o.Store, backends.StoreOptions{}); err != nil {
			return err
		}
		if s := storeScheme(o.Store); s != "postgres" && s != "postgresql" {
			return usagef("%s: the demo runs on postgres:// or, with no --store, on embedded SQLite; got a %s URL", a.flagRef("store"), s)
		}
	}
	if o.Broker != "" {
		if err := backends.CheckBrokerURL(o.Broker, backends.BrokerOptions{}); err != nil {
			return err
		}
		if s := storeScheme(o.Broker); s != "nats" {
			return usagef("%s: the demo runs on nats:// or, with no --broker, on an embedded NATS server; got a %s URL", a.flagRef("broker"), s)
		}
	}
	// The demo's own checks, as a backstop.
	if err := o.WithDefaults().Validate(); err != nil {
		if m := demoFieldRe.FindStringSubmatch(err.Error()); m != nil {
			return usagef("%s: %s", a.flagRef(strings.ToLower(m[1])), strings.TrimPrefix(err.Error(), "demo: "))
		}
		return usagef("%v", err)
	}
	return nil
}
