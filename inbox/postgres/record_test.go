package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/postgres"
)

// TestRecordConcurrentBatches: workers record overlapping batches of the same
// IDs, each batch shuffled differently, and apply the effects of the fresh
// ones in the same transaction. No deadlock, every effect exactly once.
func TestRecordConcurrentBatches(t *testing.T) {
	t.Parallel()
	const workers, messages, batch = 8, 1000, 50
	b := setup(t, workers)
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	var fresh atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			order := slices.Clone(ids)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for start := 0; start < messages; start += batch {
				part := order[start : start+batch]
				err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
					isNew, err := b.in.Record(context.Background(), tx, "orders", part)
					if err != nil {
						return err
					}
					for i, id := range part {
						if isNew[i] {
							if _, err := tx.Exec(context.Background(), effectSQL, id); err != nil {
								return err
							}
							fresh.Add(1)
						}
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := fresh.Load(); got != messages {
		t.Errorf("%d IDs reported fresh; want %d", got, messages)
	}
	if rows, maxN, _ := effects(t, b.pool); rows != messages || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want %d rows applied once", rows, maxN, messages)
	}
}

func TestRecordRepeatsAndValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	a, c, d := outbox.NewID(), outbox.NewID(), outbox.NewID()
	if _, err := b.in.Run(ctx, "orders", c, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	check := func(name string, got []bool, err error) {
		t.Helper()
		// a is new, its repeat is not, c was recorded by Run, d is new.
		if want := []bool{true, false, false, true}; err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: Record = %v, %v; want %v", name, got, err, want)
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.in.Record(ctx, tx, "orders", []string{a, a, c, d})
	check("pgx", got, err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Rolled back: the same result through database/sql.
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	sin, err := postgres.NewSQL(db, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err = sin.Record(ctx, stx, "orders", []string{a, a, c, d})
	check("database/sql", got, err)
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		got, err := b.in.Record(ctx, tx, "orders", []string{a, c, d})
		if err == nil && slices.Contains(got, true) {
			err = fmt.Errorf("after commit: Record = %v; want all false", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.in.Record(ctx, tx, "orders", nil); err == nil {
			t.Error("empty batch accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var stx2 *sql.Tx
	if _, err := sin.Record(ctx, stx2, "orders", []string{a}); err == nil {
		t.Error("nil *sql.Tx accepted")
	}
	if _, err := sin.Record(ctx, nil, "orders", make([]string, inbox.MaxBatch+1)); err == nil {
		t.Error("oversized batch accepted")
	}
}
