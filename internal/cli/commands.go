package cli

import "github.com/spf13/cobra"

// commands lists the subcommands of outbox, in the order --help shows them.
// Each constructor lives in its own file and receives the shared *app (its
// writers, logger and environment).
//
// To add a command (such as `outbox bench`, which goes right after demo),
// write newXxxCommand(a *app) *cobra.Command in xxx.go, run its body through
// a.run so that exit codes come out right, return usage mistakes with usagef
// (or a *backends.ConfigError), and add it to this list.
var commands = []func(*app) *cobra.Command{
	newMigrateCommand,
	newRelayCommand,
	newStatusCommand,
	newDLQCommand,
	newConsoleCommand,
	newDestinationsCommand,
	newDemoCommand,
	newBenchCommand,
	newVersionCommand,
}
