package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/sqlite"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// clock is an injectable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type bundle struct {
	db    *sql.DB
	in    *sqlite.Inbox
	clock *clock
}

func setup(t *testing.T) bundle {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "inbox.db") +
		"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c := &clock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	in, err := sqlite.New(db, sqlite.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id TEXT PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return bundle{db: db, in: in, clock: c}
}

// applyEffect counts one application of the effect of message id.
func applyEffect(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1`, id)
	return err
}

func effects(t *testing.T, db *sql.DB) (rows, maxN, total int) {
	t.Helper()
	err := db.QueryRow(`SELECT count(*), coalesce(max(n), 0), coalesce(sum(n), 0) FROM effects`).Scan(&rows, &maxN, &total)
	if err != nil {
		t.Fatal(err)
	}
	return rows, maxN, total
}

func TestRunOnceAndDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := outbox.NewID()
	fn := func(ctx context.Context, tx *sql.Tx) error { return applyEffect(ctx, tx, id) }

	processed, err := b.in.Run(ctx, "orders", id, fn)
	if err != nil || !processed {
		t.Fatalf("first Run = %v, %v; want true, nil", processed, err)
	}
	processed, err = b.in.Run(ctx, "orders", id, fn)
	if err != nil || processed {
		t.Fatalf("second Run = %v, %v; want false, nil (duplicate)", processed, err)
	}
	// Another consumer handles the same message independently.
	processed, err = b.in.Run(ctx, "billing", id, func(ctx context.Context, tx *sql.Tx) error { return nil })
	if err != nil || !processed {
		t.Fatalf("Run for another consumer = %v, %v; want true, nil", processed, err)
	}
	if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1 row applied once", rows, maxN)
	}
}

func TestHandlerErrorRollsBackRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := outbox.NewID()
	boom := errors.New("boom")
	processed, err := b.in.Run(ctx, "orders", id, func(ctx context.Context, tx *sql.Tx) error {
		if err := applyEffect(ctx, tx, id); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || processed {
		t.Fatalf("Run = %v, %v; want false, boom", processed, err)
	}
	if rows, _, _ := effects(t, b.db); rows != 0 {
		t.Fatalf("the failed handler's effect was kept (%d rows)", rows)
	}
	// Not marked: the redelivery runs the handler.
	processed, err = b.in.Run(ctx, "orders", id, func(ctx context.Context, tx *sql.Tx) error { return applyEffect(ctx, tx, id) })
	if err != nil || !processed {
		t.Fatalf("Run after a failure = %v, %v; want true, nil", processed, err)
	}
	if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
	}
}

func TestProcessInCallerTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := outbox.NewID()

	// Rolled back by the caller: neither record nor effect stays.
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	processed, err := b.in.Process(ctx, tx, "orders", id, func(ctx context.Context, tx *sql.Tx) error { return applyEffect(ctx, tx, id) })
	if err != nil || !processed {
		t.Fatalf("Process = %v, %v", processed, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	// Committed by the caller: both stay, and the next delivery is dropped.
	for i, want := range []bool{true, false} {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		processed, err := b.in.Process(ctx, tx, "orders", id, func(ctx context.Context, tx *sql.Tx) error { return applyEffect(ctx, tx, id) })
		if err != nil || processed != want {
			t.Fatalf("delivery %d: Process = %v, %v; want %v, nil", i, processed, err, want)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
	}
}

// TestConcurrentDuplicates delivers the same 1,000 IDs from 20 goroutines at
// once: every effect must be applied exactly once.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const workers, messages = 20, 1000
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
				id := ids[(i+w*37)%messages] // each worker walks the IDs from another offset
				processed, err := b.in.Run(ctx, "orders", id, func(ctx context.Context, tx *sql.Tx) error {
					return applyEffect(ctx, tx, id)
				})
				if err != nil {
					errs <- fmt.Errorf("worker %d, message %s: %w", w, id, err)
					return
				}
				if processed {
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
	if got := ran.Load(); got != messages {
		t.Errorf("handlers ran %d times; want %d", got, messages)
	}
	rows, maxN, total := effects(t, b.db)
	if rows != messages || maxN != 1 || total != messages {
		t.Fatalf("effects: %d rows, max %d, total %d; want %d rows each applied once", rows, maxN, total, messages)
	}
}

func TestCleanupRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	old := make([]string, 5)
	for i := range old {
		old[i] = outbox.NewID()
		if _, err := b.in.Run(ctx, "c", old[i], noop); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(2 * time.Hour)
	recent := outbox.NewID()
	if _, err := b.in.Run(ctx, "c", recent, noop); err != nil {
		t.Fatal(err)
	}

	// Batches of 2: 2, 2, 1, then nothing older than an hour is left.
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
	// The recent record still drops its duplicate; an expired one runs again.
	if p, err := b.in.Run(ctx, "c", recent, noop); err != nil || p {
		t.Fatalf("recent duplicate: Run = %v, %v; want false, nil", p, err)
	}
	if p, err := b.in.Run(ctx, "c", old[0], noop); err != nil || !p {
		t.Fatalf("expired record: Run = %v, %v; want true, nil", p, err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	if _, err := b.in.Run(ctx, "c", "", noop); !errors.Is(err, inbox.ErrNoMessageID) {
		t.Errorf("empty message ID: err = %v; want ErrNoMessageID", err)
	}
	if _, err := b.in.Run(ctx, "", "x", noop); err == nil || !strings.Contains(err.Error(), "consumer") {
		t.Errorf("empty consumer: err = %v; want an error naming the consumer", err)
	}
	if _, err := b.in.Run(ctx, "c", strings.Repeat("x", inbox.MaxMessageIDLen+1), noop); err == nil || !strings.Contains(err.Error(), "message ID") {
		t.Errorf("long message ID: err = %v", err)
	}
	if _, err := b.in.Cleanup(ctx, 0, 10); err == nil || !strings.Contains(err.Error(), "olderThan") {
		t.Errorf("Cleanup(0): err = %v; want an error naming olderThan", err)
	}
	if _, err := b.in.Cleanup(ctx, time.Hour, 0); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("Cleanup limit 0: err = %v; want an error naming limit", err)
	}
	for _, prefix := range []string{`x"; DROP TABLE effects; --`, "1abc", strings.Repeat("a", 60)} {
		if _, err := sqlite.New(b.db, sqlite.Options{TablePrefix: prefix}); err == nil || !strings.Contains(err.Error(), "TablePrefix") {
			t.Errorf("TablePrefix %q: err = %v; want an error naming TablePrefix", prefix, err)
		}
	}
	if _, err := sqlite.New(nil, sqlite.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestRecordBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := make([]string, 2500) // more than one INSERT chunk
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	if _, err := b.in.Run(ctx, "orders", ids[10], func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	batch := append(slices.Clone(ids), ids[5]) // a repeat within the batch
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := b.in.Record(ctx, tx, "orders", batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range fresh {
		want := i != 10 && i != len(batch)-1
		if f != want {
			t.Fatalf("fresh[%d] = %v; want %v", i, f, want)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, err = b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	fresh, err = b.in.Record(ctx, tx, "orders", ids[:3])
	if err != nil || slices.Contains(fresh, true) {
		t.Fatalf("after commit: Record = %v, %v; want all false", fresh, err)
	}
	if _, err := b.in.Record(ctx, tx, "orders", nil); err == nil {
		t.Error("empty batch accepted")
	}
}
