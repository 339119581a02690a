package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
)

func newMigrateCommand(a *app) *cobra.Command {
	var (
		sf       storeFlags
		timeout  time.Duration
		printSQL bool
		dryRun   bool
	)
	cmd := &cobra.Command{
		Use:   "migrate --store URL",
		Short: "Create or upgrade the outbox tables (safe to run again)",
		Long: `migrate creates the outbox tables in the store, or upgrades them, and says
which migrations it applied; running it again is a no-op that says the tables
are up to date. The partition count P is fixed when the tables are created;
asking for another P later fails.

An upgrade that adds an index to existing PostgreSQL tables builds it with
CREATE INDEX CONCURRENTLY, outside a transaction, so that writers are not
blocked; an invalid index left by a failed concurrent build is dropped and
built again.

--print-sql prints the SQL for the schema, table prefix and partition count
(for goose, Flyway, atlas or a DBA) without connecting; applying it and then
running migrate is a no-op. --dry-run connects and says what would be applied.
Both follow the store URL's layout=ring (PostgreSQL): --print-sql prints the
ring, --dry-run says whether migrate would create it or convert the table.

With --capture wal it also creates the publication and the logical
replication slot the relay reads, after checking that the server can stream
(wal_level = logical, the REPLICATION attribute, a free slot); run it before
writers emit into the WAL.`,
		Example: `  outbox migrate --store postgres://app@localhost:5432/app --schema outbox
  outbox migrate --print-sql --schema outbox --partitions 128 > outbox.sql
  outbox migrate --dry-run --store postgres://app@localhost:5432/app`,
		Args: cobra.NoArgs,
	}
	sf.add(cmd.Flags(), storeFlagSet{partitions: true})
	timeoutFlag(cmd.Flags(), &timeout)
	cmd.Flags().BoolVar(&printSQL, "print-sql", false, "print the SQL that creates the tables (PostgreSQL) and exit, without connecting; --store is optional")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say which migrations would be applied, changing nothing")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if printSQL && dryRun {
			return usagef("--print-sql and --dry-run do not go together; give one")
		}
		if printSQL {
			url := sf.url
			if url == "" {
				url = "postgres://localhost/" // only the scheme matters
			}
			sql, err := backends.MigrationSQL(url, sf.options())
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(a.env.Stdout, sql)
			return err
		}
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
		if dryRun {
			return a.dryRunMigrate(ctx, s)
		}
		start := a.env.Now()
		var rep backends.MigrateReport
		if r, ok := s.(backends.MigrateReporter); ok {
			rep, err = r.MigrateWithReport(ctx)
		} else {
			err = s.Migrate(ctx)
		}
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		p, err := s.Partitions(ctx)
		if err != nil {
			return fmt.Errorf("read partition count: %w", err)
		}
		a.log.Info("migrated", "partitions", p, "created", rep.Created, "applied", len(rep.Applied), "took", a.env.Now().Sub(start).Round(time.Millisecond))
		for _, idx := range rep.DroppedInvalid {
			fmt.Fprintf(a.env.Stdout, "dropped the invalid index %s left by a failed concurrent build, and built it again\n", idx)
		}
		switch {
		case rep.Created && len(rep.Applied) == 0:
			fmt.Fprintf(a.env.Stdout, "created the outbox tables (%d partitions)\n", p)
		case rep.Created:
			fmt.Fprintf(a.env.Stdout, "created the outbox tables (%d partitions): applied %s\n", p, strings.Join(rep.Applied, ", "))
		case len(rep.Applied) > 0:
			fmt.Fprintf(a.env.Stdout, "upgraded the outbox tables (%d partitions): applied %s\n", p, strings.Join(rep.Applied, ", "))
		default:
			fmt.Fprintf(a.env.Stdout, "outbox tables are up to date (%d partitions)\n", p)
		}
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

// dryRunMigrate prints the migrations Migrate would apply.
func (a *app) dryRunMigrate(ctx context.Context, s backends.Store) error {
	planner, ok := s.(backends.MigrationPlanner)
	if !ok {
		return usagef("--dry-run is not supported by this store; run migrate without it (it is idempotent)")
	}
	pending, err := planner.PendingMigrations(ctx)
	if err != nil {
		return fmt.Errorf("migrate --dry-run: %w", err)
	}
	if len(pending) == 0 {
		fmt.Fprintln(a.env.Stdout, "outbox tables are up to date: nothing to apply")
		return nil
	}
	fmt.Fprintf(a.env.Stdout, "would apply %d migration(s):\n", len(pending))
	for _, m := range pending {
		fmt.Fprintf(a.env.Stdout, "  %s\n", m)
	}
	return nil
}
