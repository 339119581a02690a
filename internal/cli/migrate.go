package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
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
asking for another P later fails. With --capture wal it also creates the
publication and the logical replication slot the relay reads, after checking
that the server can stream (wal_level = logical, the REPLICATION attribute,
a free slot); run it before writers emit into the WAL.`,
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
		if sr, ok := s.(outbox.SlotReader); ok {
			st, err := sr.SlotStatus(ctx)
			if err != nil {
				return fmt.Errorf("read the replication slot: %w", err)
			}
			fmt.Fprintf(a.env.Stdout, "replication slot %s is ready (capture wal; messages committed from now on are captured)\n", st.Name)
		}
		return nil
	})
	return cmd
}
