//go:build !outbox_slim

package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox/internal/bench"
)

// newBenchCeilingCommand is the steady-load ceiling's process `outbox
// bench` starts after steady/key@RATE (hidden: the bench runs it from its
// own binary): bench.RunSteadyCeiling on the store of OUTBOX_STORE and the
// broker of OUTBOX_BROKER (the URLs stay out of the process list), as
// `outbox relay` gets them from the bench. It prints one line, ready, once
// it LISTENs, then nothing but errors, and stops on SIGINT or SIGTERM
// after a final settle.
func newBenchCeilingCommand(a *app) *cobra.Command {
	var (
		c          bench.CeilingConfig
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:    bench.CeilingCommand[1],
		Short:  "Run the bench's steady-load ceiling (LISTEN, SELECT, publish, DELETE: nothing else)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			c.DSN, _ = a.env.LookupEnv("OUTBOX_STORE")
			c.Broker, _ = a.env.LookupEnv("OUTBOX_BROKER")
			c.Ready = a.env.Stdout
			if err := c.Validate(); err != nil {
				return usagef("%v", err)
			}
			stop, err := a.startCPUProfile(cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
			return bench.RunSteadyCeiling(ctx, c)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&c.Schema, "schema", "", "schema of the outbox table (outbox_messages)")
	fs.StringVar(&c.Channel, "channel", "", "the outbox's LISTEN/NOTIFY channel")
	fs.IntVar(&c.Partitions, "partitions", 0, "the outbox's partitions")
	fs.StringVar(&c.SubjectPrefix, "subject-prefix", "", "the bench's destination on the broker")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the process's CPU profile (its whole run) to this file")
	return cmd
}
