package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newMigrateCommand(a *app) *cobra.Command {
	var (
		sf      storeFlags
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "migrate --store URL",
		Short: "Create or upgrade the outbox tables (safe to run again)",
		Long: `migrate creates the outbox tables in the store, or upgrades them. Running it
again is a no-op. The partition count P is fixed when the tables are created;
asking for another P later fails.`,
		Example: "  outbox migrate --store postgres://app@localhost:5432/app --schema outbox",
		Args:    cobra.NoArgs,
	}
	sf.add(cmd.Flags(), storeFlagSet{partitions: true})
	timeoutFlag(cmd.Flags(), &timeout)
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		ctx, cancel, err := a.withTimeout(ctx, timeout)
		if err != nil {
			return err
		}
		defer cancel()
		s, err := sf.open(ctx, a)
		if err != nil {
			return err
		}
		defer a.closeStore(s)
		start := a.env.Now()
		if err := s.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		p, err := s.Partitions(ctx)
		if err != nil {
			return fmt.Errorf("read partition count: %w", err)
		}
		a.log.Info("migrated", "partitions", p, "took", a.env.Now().Sub(start).Round(time.Millisecond))
		fmt.Fprintf(a.env.Stdout, "outbox tables are up to date (%d partitions)\n", p)
		return nil
	})
	return cmd
}
