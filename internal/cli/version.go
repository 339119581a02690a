package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox/internal/buildinfo"
)

func newVersionCommand(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this build",
		Long: `version prints the module version, the VCS commit and the Go version this
binary was built with, as recorded by the go command (runtime/debug.ReadBuildInfo).
outbox --version prints the same line. The relay exports them on /metrics as
the outbox_build_info gauge.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object")
	cmd.RunE = a.run(func(_ context.Context, _ *cobra.Command, _ []string) error {
		info := buildinfo.Read()
		if asJSON {
			return json.NewEncoder(a.env.Stdout).Encode(info)
		}
		_, err := fmt.Fprintln(a.env.Stdout, info.String())
		return err
	})
	return cmd
}

// newBuildInfoGauge returns the outbox_build_info gauge, 1 with the build's
// version, revision and Go version as labels.
func newBuildInfoGauge() prometheus.Collector {
	info := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "outbox_build_info",
		Help:        "A metric with a constant '1' value labelled by the outbox build's version, revision and Go version.",
		ConstLabels: info.Labels(),
	})
	g.Set(1)
	return g
}
