// Package inboxbench measures the consumer-side idempotency tools, for
// `outbox bench`:
//
//   - [Postgres]: inbox throughput (deliveries per second through
//     postgres.Inbox.Run, each with a one-row effect) with a share of
//     duplicate deliveries;
//   - [DynamoDB]: conditional-update throughput on one DynamoDB item through
//     a dynamodb.Window, next to the article's bound for that item (1,000
//     write units per second per partition ÷ write units per update).
//
// Each function checks its own outcome (every effect applied exactly once)
// and returns an error if it was not, so a fast but wrong run never reports
// a number. They are not safe to run against production tables: they create
// and drop their own schema or table.
package inboxbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox/postgres"
)

// Defaults of [PostgresOptions].
const (
	MessagesDefault = 10000
	WorkersDefault  = 8
)

// PostgresOptions configures [Postgres]. Zero fields take their defaults.
type PostgresOptions struct {
	// Messages is the number of distinct messages; default
	// [MessagesDefault].
	Messages int
	// Duplicates is the fraction of deliveries that are duplicates of an
	// earlier delivery, in [0, 0.9]: 0.2 delivers Messages / 0.8
	// messages in all. Default 0.
	Duplicates float64
	// Workers is the number of concurrent consumers, each with its own
	// connection; default [WorkersDefault].
	Workers int
}

// PostgresResult is the outcome of [Postgres].
type PostgresResult struct {
	Deliveries int           // messages delivered, duplicates included
	Processed  int           // handlers run (= Messages)
	Duplicates int           // deliveries dropped by the inbox
	Elapsed    time.Duration // wall time of the deliveries
	PerSecond  float64       // Deliveries / Elapsed
}

func (r PostgresResult) String() string {
	return fmt.Sprintf("%d deliveries (%d duplicates) in %v: %.0f msg/s", r.Deliveries, r.Duplicates, r.Elapsed.Round(time.Millisecond), r.PerSecond)
}

// Postgres delivers Messages distinct messages, plus duplicates, to
// Workers consumers that handle each through a postgres.Inbox with a
// one-row INSERT as the effect, on the database at dsn. It creates a schema
// of its own and drops it afterwards. A duplicate is delivered after its
// original was handled (a redelivery), from a random worker.
func Postgres(ctx context.Context, dsn string, opts PostgresOptions) (PostgresResult, error) {
	opts.Messages = cmp.Or(opts.Messages, MessagesDefault)
	opts.Workers = cmp.Or(opts.Workers, WorkersDefault)
	switch {
	case opts.Messages < 1:
		return PostgresResult{}, fmt.Errorf("inboxbench: PostgresOptions.Messages must be positive, got %d", opts.Messages)
	case opts.Workers < 1 || opts.Workers > 256:
		return PostgresResult{}, fmt.Errorf("inboxbench: PostgresOptions.Workers must be between 1 and 256, got %d", opts.Workers)
	case opts.Duplicates < 0 || opts.Duplicates > 0.9:
		return PostgresResult{}, fmt.Errorf("inboxbench: PostgresOptions.Duplicates must be between 0 and 0.9, got %v", opts.Duplicates)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return PostgresResult{}, fmt.Errorf("inboxbench: %w", err)
	}
	cfg.MaxConns = int32(opts.Workers) + 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return PostgresResult{}, fmt.Errorf("inboxbench: %w", err)
	}
	defer pool.Close()

	schema := "inbox_bench_" + strconv.FormatUint(rand.Uint64()%1e12, 36)
	in, err := postgres.New(pool, postgres.Options{Schema: schema})
	if err != nil {
		return PostgresResult{}, err
	}
	if err := in.Migrate(ctx); err != nil {
		return PostgresResult{}, err
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`) //nolint:errcheck // best effort
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id text PRIMARY KEY, handled_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return PostgresResult{}, fmt.Errorf("inboxbench: %w", err)
	}
	insert := `INSERT INTO ` + effects + ` (id) VALUES ($1)`

	deliveries := plan(opts.Messages, opts.Duplicates)
	var processed, dups atomic.Int64
	next := atomic.Int64{}
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range opts.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(deliveries) || ctx.Err() != nil {
					return
				}
				id := deliveries[i]
				p, err := in.Run(ctx, "bench", id, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, insert, id)
					return err
				})
				if err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				if p {
					processed.Add(1)
				} else {
					dups.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return PostgresResult{}, fmt.Errorf("inboxbench: %w", firstErr)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&rows); err != nil {
		return PostgresResult{}, fmt.Errorf("inboxbench: %w", err)
	}
	r := PostgresResult{
		Deliveries: len(deliveries),
		Processed:  int(processed.Load()),
		Duplicates: int(dups.Load()),
		Elapsed:    elapsed,
		PerSecond:  float64(len(deliveries)) / elapsed.Seconds(),
	}
	if r.Processed != opts.Messages || rows != opts.Messages {
		return r, fmt.Errorf("inboxbench: %d handlers ran and %d effects stored for %d messages: the inbox did not apply each exactly once", r.Processed, rows, opts.Messages)
	}
	return r, nil
}

// plan returns the delivery order: every message once, in order, and
// duplicates of earlier messages placed at least one batch of deliveries
// after their original, so that they arrive as redeliveries.
func plan(messages int, dupFraction float64) []string {
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	total := int(float64(messages)/(1-dupFraction) + 0.5)
	out := make([]string, 0, total)
	const lag = 64 // a duplicate follows its original by at least this many deliveries
	for i, id := range ids {
		out = append(out, id)
		// Spread the duplicates evenly over the run.
		for len(out) < total && float64(len(out)-i-1) < float64(i+1)*float64(total-messages)/float64(messages) {
			j := max(0, i-lag-rand.IntN(lag))
			if i < lag {
				j = rand.IntN(i + 1)
			}
			out = append(out, ids[j])
		}
	}
	for len(out) < total {
		out = append(out, ids[rand.IntN(messages)])
	}
	return out
}

var errNoClient = errors.New("inboxbench: DynamoDB needs a non-nil client")
