package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/postgres"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool *pgxpool.Pool
	in   *postgres.Inbox
	opts postgres.Options
}

// setup returns an inbox on a fresh database, migrated, with an effects
// table counting how often each message's effect was applied.
func setup(t *testing.T, maxConns int32) bundle {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	opts := postgres.Options{Schema: "Consumer_" + testenv.Name(t)[:10], TablePrefix: "app"}
	in, err := postgres.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, in: in, opts: opts}
}

const effectSQL = `INSERT INTO effects (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1`

func applyEffect(id string) inbox.Func[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, effectSQL, id)
		return err
	}
}

func effects(t *testing.T, pool *pgxpool.Pool) (rows, maxN, total int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT count(*), coalesce(max(n), 0), coalesce(sum(n), 0) FROM effects`).Scan(&rows, &maxN, &total)
	if err != nil {
		t.Fatal(err)
	}
	return rows, maxN, total
}

func TestRunOnceAndDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	id := outbox.NewID()
	if p, err := b.in.Run(ctx, "orders", id, applyEffect(id)); err != nil || !p {
		t.Fatalf("first Run = %v, %v; want true, nil", p, err)
	}
	if p, err := b.in.Run(ctx, "orders", id, applyEffect(id)); err != nil || p {
		t.Fatalf("second Run = %v, %v; want false, nil", p, err)
	}
	if p, err := b.in.Run(ctx, "billing", id, func(context.Context, pgx.Tx) error { return nil }); err != nil || !p {
		t.Fatalf("another consumer: Run = %v, %v; want true, nil", p, err)
	}
	if rows, maxN, _ := effects(t, b.pool); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.in.Table()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("records in %s: %d (%v); want 2", b.in.Table(), n, err)
	}
}

func TestHandlerErrorLeavesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	id := outbox.NewID()
	boom := errors.New("boom")
	p, err := b.in.Run(ctx, "orders", id, func(ctx context.Context, tx pgx.Tx) error {
		if err := applyEffect(id)(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || p {
		t.Fatalf("Run = %v, %v; want false, boom", p, err)
	}
	if p, err := b.in.Run(ctx, "orders", id, applyEffect(id)); err != nil || !p {
		t.Fatalf("redelivery after failure: Run = %v, %v; want true, nil", p, err)
	}
	if rows, maxN, _ := effects(t, b.pool); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
	}
}

// waitForLockWaiters polls until n backends of this database wait on a lock.
func waitForLockWaiters(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends wait on a lock after 30s; want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// TestConcurrentDuplicateWaits shows that a second delivery waits for the
// first one's transaction: a duplicate after its commit, handled after its
// rollback.
func TestConcurrentDuplicateWaits(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			b := setup(t, 4)
			ctx := context.Background()
			id := outbox.NewID()
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if p, err := b.in.Process(ctx, tx, "orders", id, applyEffect(id)); err != nil || !p {
				t.Fatalf("Process = %v, %v", p, err)
			}
			type result struct {
				processed bool
				err       error
			}
			second := make(chan result, 1)
			go func() {
				p, err := b.in.Run(ctx, "orders", id, applyEffect(id))
				second <- result{p, err}
			}()
			waitForLockWaiters(t, b.pool, 1)
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-second
			if r.err != nil || r.processed == commit {
				t.Fatalf("second delivery: Run = %v, %v; want %v, nil", r.processed, r.err, !commit)
			}
			if rows, maxN, _ := effects(t, b.pool); rows != 1 || maxN != 1 {
				t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
			}
		})
	}
}

// TestConcurrentDuplicates delivers the same 1,000 IDs from 20 goroutines at
// once: every effect must be applied exactly once.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const workers, messages = 20, 1000
	b := setup(t, workers)
	ran := deliverConcurrently(t, workers, messages, func(ctx context.Context, id string) (bool, error) {
		return b.in.Run(ctx, "orders", id, applyEffect(id))
	})
	if ran != messages {
		t.Errorf("handlers ran %d times; want %d", ran, messages)
	}
	rows, maxN, total := effects(t, b.pool)
	if rows != messages || maxN != 1 || total != messages {
		t.Fatalf("effects: %d rows, max %d, total %d; want %d rows each applied once", rows, maxN, total, messages)
	}
}

// deliverConcurrently runs deliver for each of messages IDs from each of
// workers goroutines, every worker in another order, and returns how many
// deliveries were processed.
func deliverConcurrently(t *testing.T, workers, messages int, deliver func(context.Context, string) (bool, error)) int64 {
	t.Helper()
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	var ran atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range messages {
				id := ids[(i+w*37)%messages]
				p, err := deliver(context.Background(), id)
				if err != nil {
					errs <- fmt.Errorf("worker %d, message %s: %w", w, id, err)
					return
				}
				if p {
					ran.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ran.Load()
}

func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	in, err := postgres.NewSQL(db, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := in.Migrate(ctx); err != nil { // already there: idempotent
		t.Fatal(err)
	}
	fn := func(id string) inbox.Func[*sql.Tx] {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, effectSQL, id)
			return err
		}
	}
	const workers, messages = 4, 200
	ran := deliverConcurrently(t, workers, messages, func(ctx context.Context, id string) (bool, error) {
		return in.Run(ctx, "orders", id, fn(id))
	})
	if ran != messages {
		t.Errorf("handlers ran %d times; want %d", ran, messages)
	}
	if rows, maxN, _ := effects(t, b.pool); rows != messages || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want %d, 1", rows, maxN, messages)
	}

	// Process in the caller's transaction, shared with the pgx inbox's table.
	id := outbox.NewID()
	if p, err := b.in.Run(ctx, "orders", id, applyEffect(id)); err != nil || !p {
		t.Fatalf("pgx Run = %v, %v", p, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if p, err := in.Process(ctx, tx, "orders", id, fn(id)); err != nil || p {
		t.Fatalf("database/sql Process of a pgx-recorded ID = %v, %v; want false, nil", p, err)
	}

	// Cleanup through database/sql.
	if _, err := b.pool.Exec(ctx, `UPDATE `+in.Table()+` SET processed_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	n, err := in.Cleanup(ctx, time.Hour, 100000)
	if err != nil || n != messages+1 {
		t.Fatalf("Cleanup = %d, %v; want %d", n, err, messages+1)
	}
}

func TestCleanupRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	old := make([]string, 5)
	for i := range old {
		old[i] = outbox.NewID()
		if _, err := b.in.Run(ctx, "c", old[i], noop); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.in.Table()+` SET processed_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	recent := outbox.NewID()
	if _, err := b.in.Run(ctx, "c", recent, noop); err != nil {
		t.Fatal(err)
	}
	var got []int64
	for {
		n, err := b.in.Cleanup(ctx, time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
		if n < 2 {
			break
		}
	}
	if fmt.Sprint(got) != "[2 2 1]" {
		t.Fatalf("Cleanup batches = %v; want [2 2 1]", got)
	}
	if p, err := b.in.Run(ctx, "c", recent, noop); err != nil || p {
		t.Fatalf("recent duplicate: Run = %v, %v; want false, nil", p, err)
	}
	if p, err := b.in.Run(ctx, "c", old[0], noop); err != nil || !p {
		t.Fatalf("expired record: Run = %v, %v; want true, nil", p, err)
	}
}

func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	ctx := context.Background()
	opts := postgres.Options{Schema: "fresh", TablePrefix: "Mixed_Case"}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			in, err := postgres.New(b.pool, opts)
			if err == nil {
				err = in.Migrate(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	table, err := opts.Table()
	if err != nil || table != `"fresh"."Mixed_Case_inbox"` {
		t.Fatalf("Table() = %s, %v", table, err)
	}
	stmts, err := opts.MigrationSQL()
	if err != nil || len(stmts) != 3 || !strings.Contains(stmts[1], table) {
		t.Fatalf("MigrationSQL() = %q, %v", stmts, err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := b.in.Run(ctx, "c", "", noop); !errors.Is(err, inbox.ErrNoMessageID) {
		t.Errorf("empty message ID: err = %v; want ErrNoMessageID", err)
	}
	if _, err := b.in.Run(ctx, "", "x", noop); err == nil || !strings.Contains(err.Error(), "consumer") {
		t.Errorf("empty consumer: err = %v", err)
	}
	if _, err := b.in.Run(ctx, "c", "a\x00b", noop); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("NUL in message ID: err = %v", err)
	}
	if _, err := b.in.Cleanup(ctx, -time.Second, 10); err == nil || !strings.Contains(err.Error(), "olderThan") {
		t.Errorf("Cleanup(-1s): err = %v", err)
	}
	for _, o := range []postgres.Options{
		{Schema: `x"; DROP TABLE effects; --`},
		{Schema: "9lives"},
		{TablePrefix: strings.Repeat("a", postgres.MaxTablePrefixLen+1)},
		{TablePrefix: "has space"},
	} {
		_, err := postgres.New(b.pool, o)
		field := "TablePrefix"
		if o.Schema != "" {
			field = "Schema"
		}
		if err == nil || !strings.Contains(err.Error(), "Options."+field) {
			t.Errorf("%+v: err = %v; want an error naming Options.%s", o, err, field)
		}
	}
	if _, err := postgres.New(nil, postgres.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}
