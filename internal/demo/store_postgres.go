package demo

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	pginbox "github.com/outboxrelay/outbox/inbox/postgres"
	"github.com/outboxrelay/outbox/store/postgres"
)

// pgOrders keeps the outbox and the order tables in a schema of their own,
// outbox_demo_<run>, dropped at the end.
type pgOrders struct {
	s      *postgres.Store
	pool   *pgxpool.Pool
	schema string // quoted
	log    *slog.Logger

	customers, orders string         // quoted, qualified
	in                *pginbox.Inbox // the consumer's processed message IDs
}

func openPostgres(ctx context.Context, dsn, runID string, log *slog.Logger) (*pgOrders, string, error) {
	schema := "outbox_demo_" + runID
	s, err := postgres.Open(ctx, dsn, postgres.Options{Schema: schema})
	if err != nil {
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	o := &pgOrders{
		s: s, pool: s.Pool(), schema: pgx.Identifier{schema}.Sanitize(), log: log,
		customers: q("demo_customers"), orders: q("demo_orders"),
	}
	if err := s.Migrate(ctx); err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	if _, err := o.pool.Exec(ctx, `
CREATE TABLE `+o.customers+` (id text PRIMARY KEY, seq bigint NOT NULL);
CREATE TABLE `+o.orders+` (id text PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL, stage integer NOT NULL, created_at timestamptz NOT NULL);`); err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: create the order tables: %w", err)
	}
	if o.in, err = pginbox.New(o.pool, pginbox.Options{Schema: schema, TablePrefix: "demo"}); err == nil {
		err = o.in.Migrate(ctx)
	}
	if err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: create the inbox: %w", err)
	}
	cfg := o.pool.Config().ConnConfig
	return o, fmt.Sprintf("PostgreSQL (%s:%d/%s, schema %s)", cfg.Host, cfg.Port, cfg.Database, schema), nil
}

func (o *pgOrders) store() outbox.Store { return o.s }

func (o *pgOrders) placeOrder(ctx context.Context, ord order) error {
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var last int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+o.customers+` AS c (id, seq) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET seq = c.seq + EXCLUDED.seq RETURNING seq`, ord.Customer, eventsPerOrder).Scan(&last); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+o.orders+` (id, customer, amount, stage, created_at) VALUES ($1, $2, $3, 0, now())`,
			ord.ID, ord.Customer, ord.Amount); err != nil {
			return err
		}
		msgs, err := orderMessages(ord, last)
		if err != nil {
			return err
		}
		return o.s.Writer().Write(ctx, tx, msgs...)
	})
}

func (o *pgOrders) apply(ctx context.Context, evs []event) (map[string]bool, error) {
	fresh := make(map[string]bool, len(evs))
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		ids := make([]string, len(evs))
		for i, e := range evs {
			ids[i] = e.id
		}
		// The inbox records the IDs in this transaction: the effects below
		// and the record commit together, so a redelivery is dropped.
		flags, err := o.in.Record(ctx, tx, demoConsumer, ids)
		if err != nil {
			return err
		}
		for i, f := range flags {
			if f {
				fresh[ids[i]] = true
			}
		}
		stages := maxStages(evs, fresh)
		orderIDs := make([]string, 0, len(stages))
		levels := make([]int32, 0, len(stages))
		for id, s := range stages {
			orderIDs = append(orderIDs, id)
			levels = append(levels, int32(s))
		}
		tag, err := tx.Exec(ctx, `UPDATE `+o.orders+` o SET stage = greatest(o.stage, v.stage)
FROM unnest($1::text[], $2::integer[]) AS v(id, stage) WHERE o.id = v.id`, orderIDs, levels)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != int64(len(orderIDs)) {
			return fmt.Errorf("events name %d orders, of which %d exist", len(orderIDs), tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fresh, nil
}

func (o *pgOrders) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := o.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+o.schema+" CASCADE"); err != nil {
		o.log.Warn("demo: drop the demo schema", "schema", o.schema, "err", err)
	}
	o.s.Close()
}

// openStore opens the store named by url ("" for SQLite) and returns it
// with a description for the header line.
func openStore(ctx context.Context, url, runID string, log *slog.Logger) (orderStore, string, error) {
	if url == "" {
		return openSQLite(ctx, log)
	}
	return openPostgres(ctx, url, runID, log)
}
