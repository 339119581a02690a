package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/mysql"
	"github.com/outboxrelay/outbox/internal/testenv"
	outboxmysql "github.com/outboxrelay/outbox/store/mysql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	db *sql.DB
	in *mysql.Inbox
}

// setup returns an inbox on a fresh database, migrated, with an effects
// table counting how often each message's effect was applied.
func setup(t *testing.T, maxConns int) bundle {
	t.Helper()
	ctx := context.Background()
	s, err := outboxmysql.Open(ctx, testenv.MySQLURL(t), outboxmysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	db := s.DB()
	db.SetMaxOpenConns(maxConns)
	in, err := mysql.New(db, mysql.Options{TablePrefix: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id VARCHAR(64) PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	return bundle{db: db, in: in}
}

const effectSQL = `INSERT INTO effects (id, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1`

func applyEffect(id string) inbox.Func[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, effectSQL, id)
		return err
	}
}

func effects(t *testing.T, db *sql.DB) (rows, maxN, total int) {
	t.Helper()
	err := db.QueryRowContext(context.Background(), `SELECT count(*), coalesce(max(n), 0), coalesce(sum(n), 0) FROM effects`).Scan(&rows, &maxN, &total)
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
	if p, err := b.in.Run(ctx, "billing", id, func(context.Context, *sql.Tx) error { return nil }); err != nil || !p {
		t.Fatalf("another consumer: Run = %v, %v; want true, nil", p, err)
	}
	if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
	}
	var n int
	if err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM `+b.in.Table()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("records in %s: %d (%v); want 2", b.in.Table(), n, err)
	}
}

func TestHandlerErrorLeavesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	id := outbox.NewID()
	boom := errors.New("boom")
	p, err := b.in.Run(ctx, "orders", id, func(ctx context.Context, tx *sql.Tx) error {
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
	if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
		t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
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
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
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
			deadline := time.Now().Add(30 * time.Second)
			for {
				// Waiting: InnoDB says so, or the second delivery's INSERT
				// is in progress while the first holds the row (MariaDB's
				// innodb_trx, a cache, did not always show the wait).
				var waiting int
				if err := b.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT')
    + (SELECT count(*) FROM information_schema.processlist WHERE command = 'Query' AND id <> CONNECTION_ID() AND info LIKE 'INSERT INTO %inbox%' AND info LIKE ?)`, "%"+id+"%").Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting > 0 {
					break
				}
				select {
				case r := <-second:
					t.Fatalf("the second delivery returned (%v, %v) without waiting for the first", r.processed, r.err)
				default:
				}
				if time.Now().After(deadline) {
					rows, _ := b.db.QueryContext(ctx, "SELECT id, command, state, info FROM information_schema.processlist")
					for rows != nil && rows.Next() {
						var id int
						var c, st, info sql.NullString
						rows.Scan(&id, &c, &st, &info)
						t.Logf("process %d: %s, %s: %s", id, c.String, st.String, info.String)
					}
					t.Fatal("the second delivery does not wait for the first")
				}
				time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-second
			if r.err != nil || r.processed == commit {
				t.Fatalf("second delivery: Run = %v, %v; want %v, nil", r.processed, r.err, !commit)
			}
			if rows, maxN, _ := effects(t, b.db); rows != 1 || maxN != 1 {
				t.Fatalf("effects: %d rows, max %d; want 1, 1", rows, maxN)
			}
		})
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

// TestConcurrentDuplicates delivers the same 300 IDs from 10 goroutines at
// once: every effect must be applied exactly once.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const workers, messages = 10, 300
	b := setup(t, workers)
	ran := deliverConcurrently(t, workers, messages, func(ctx context.Context, id string) (bool, error) {
		return b.in.Run(ctx, "orders", id, applyEffect(id))
	})
	if ran != messages {
		t.Errorf("handlers ran %d times; want %d", ran, messages)
	}
	rows, maxN, total := effects(t, b.db)
	if rows != messages || maxN != 1 || total != messages {
		t.Fatalf("effects: %d rows, max %d, total %d; want %d rows each applied once", rows, maxN, total, messages)
	}
}

// TestRecordBatches: workers record overlapping batches of the same IDs,
// each applying the effects of the IDs Record says are fresh: every effect
// exactly once; repeats within a batch are fresh once.
func TestRecordBatches(t *testing.T) {
	t.Parallel()
	const workers, messages, batch = 6, 300, 25
	b := setup(t, workers)
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for start := 0; start < messages; start += batch {
				part := slices.Clone(ids[start : start+batch])
				slices.Reverse(part[:w%batch]) // another order per worker
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					errs <- err
					return
				}
				fresh, err := b.in.Record(ctx, tx, "orders", part)
				if err == nil {
					for i, f := range fresh {
						if f {
							if err = applyEffect(part[i])(ctx, tx); err != nil {
								break
							}
						}
					}
				}
				if err == nil {
					err = tx.Commit()
				} else {
					tx.Rollback()
				}
				if err != nil {
					errs <- err
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
	if rows, maxN, total := effects(t, b.db); rows != messages || maxN != 1 || total != messages {
		t.Fatalf("effects: %d rows, max %d, total %d; want %d applied once each", rows, maxN, total, messages)
	}
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	x, y := outbox.NewID(), outbox.NewID()
	fresh, err := b.in.Record(ctx, tx, "orders", []string{x, ids[0], x, y})
	if err != nil || !slices.Equal(fresh, []bool{true, false, false, true}) {
		t.Fatalf("Record with a repeat and a known ID = %v, %v; want [true false false true]", fresh, err)
	}
}

func TestCleanupRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	for range 5 {
		id := outbox.NewID()
		if _, err := b.in.Run(ctx, "orders", id, applyEffect(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.ExecContext(ctx, `UPDATE `+b.in.Table()+` SET processed_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 2 HOUR) ORDER BY processed_at LIMIT 3`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.in.Cleanup(ctx, time.Hour, 2); err != nil || n != 2 {
		t.Fatalf("Cleanup = %d, %v; want 2", n, err)
	}
	if n, err := b.in.Cleanup(ctx, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want 1", n, err)
	}
	if n, err := b.in.Cleanup(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("Cleanup = %d, %v; want 0", n, err)
	}
	if _, err := b.in.Cleanup(ctx, 0, 10); err == nil {
		t.Fatal("Cleanup with olderThan 0 succeeded")
	}
}

func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			in, err := mysql.New(b.db, mysql.Options{TablePrefix: "other"})
			if err == nil {
				err = in.Migrate(context.Background())
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
}

func TestValidation(t *testing.T) {
	t.Parallel()
	if _, err := mysql.New(nil, mysql.Options{}); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := mysql.New(&sql.DB{}, mysql.Options{TablePrefix: "x`; DROP TABLE users; --"}); err == nil || !strings.Contains(err.Error(), "TablePrefix") {
		t.Fatalf("hostile prefix: %v", err)
	}
	b := setup(t, 2)
	ctx := context.Background()
	for _, tc := range []struct{ consumer, id, want string }{
		{"", "x", "consumer is empty"},
		{"c", "", "no ID"},
		{"c", strings.Repeat("x", 201), "limit is 200"},
		{"c", "a\x00b", "NUL"},
	} {
		if _, err := b.in.Run(ctx, tc.consumer, tc.id, applyEffect("x")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%q, %q) = %v, want %q", tc.consumer, tc.id, err, tc.want)
		}
	}
	if sql, err := (mysql.Options{}).MigrationSQL(); err != nil || !strings.Contains(sql, "CREATE TABLE IF NOT EXISTS `outbox_inbox`") {
		t.Fatalf("MigrationSQL = %q, %v", sql, err)
	}
}
