//go:build outbox_slim

package cli

import "github.com/spf13/cobra"

// A slim build (go build -tags outbox_slim) leaves out `outbox demo` and
// `outbox bench`, and with them the embedded NATS server, the throwaway
// PostgreSQL starter and the plotting library they link: a production relay
// needs none of them (see docs/deploy.md for the sizes).

func newDemoCommand(*app) *cobra.Command  { return nil }
func newBenchCommand(*app) *cobra.Command { return nil }
