package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outbox"
)

// ownedLease acquires every partition for node and returns the lease of the
// partition of key.
func (b *bundle) ownedLease(t *testing.T, node, key string) outbox.Lease {
	t.Helper()
	ls, err := b.store.AcquireLeases(b.ctx, node, nil, testPartitions, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p := outbox.PartitionOf(key, testPartitions)
	for _, l := range ls {
		if l.Partition == p {
			return l
		}
	}
	t.Fatalf("%s did not get partition %d: %v", node, p, ls)
	return outbox.Lease{}
}

func TestRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Retention: time.Hour})
	msgs := []outbox.Message{{Topic: "r", Key: "k"}, {Topic: "r", Key: "k"}, {Topic: "r", Key: "k"}, {Topic: "r", Key: "k"}}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	lease := b.ownedLease(t, "n", "k")
	recs := b.all(t)
	if len(recs) != 4 {
		t.Fatalf("got %d records, want 4", len(recs))
	}
	var delivered []string
	for _, r := range recs[:3] {
		delivered = append(delivered, r.ID)
	}
	if err := b.store.Settle(b.ctx, "n", []outbox.Settlement{{Lease: lease, Delivered: delivered}}); err != nil {
		t.Fatal(err)
	}
	// Kept, but published: not fetched, not unsettled, not outstanding.
	if n := b.count(t, "_messages"); n != 4 {
		t.Errorf("%d rows kept, want 4", n)
	}
	if got := b.all(t); len(got) != 1 || got[0].ID != recs[3].ID {
		t.Errorf("fetched %d records after delivery, want only the undelivered one", len(got))
	}
	refs, err := b.store.Unsettled(b.ctx, []outbox.Cursor{{Lease: lease, After: recs[3].Seq}})
	if err != nil || len(refs) != 1 {
		t.Errorf("Unsettled = %v, %v; want the undelivered record only", refs, err)
	}
	st, err := b.store.Status(b.ctx)
	if err != nil || st.Outstanding != 1 {
		t.Errorf("Status.Outstanding = %v (%v), want 1", st, err)
	}
	// Not yet expired: nothing to clean.
	if n, err := b.store.Cleanup(b.ctx, 10); err != nil || n != 0 {
		t.Fatalf("Cleanup before the retention ends = %d, %v; want 0", n, err)
	}
	// Age the published rows past the retention (the database clock is not
	// injectable), then clean up in batches.
	if _, err := b.store.Pool().Exec(b.ctx, `UPDATE `+b.store.n.messages+` SET published_at = published_at - interval '2 hours' WHERE published_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Cleanup(b.ctx, 2); err != nil || n != 2 {
		t.Fatalf("Cleanup(2) = %d, %v; want 2", n, err)
	}
	if n, err := b.store.Cleanup(b.ctx, 2); err != nil || n != 1 {
		t.Fatalf("second Cleanup(2) = %d, %v; want 1", n, err)
	}
	if n := b.count(t, "_messages"); n != 1 {
		t.Errorf("%d rows after cleanup, want the 1 unpublished", n)
	}

	// Claims mark published too, and do not claim published records.
	if err := b.write(t, outbox.Message{Topic: "r"}); err != nil {
		t.Fatal(err)
	}
	c, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Records()) != 2 {
		t.Fatalf("claimed %d, want 2", len(c.Records()))
	}
	if err := c.Settle(b.ctx, outbox.Settlement{Delivered: []string{c.Records()[0].ID, c.Records()[1].ID}}); err != nil {
		t.Fatal(err)
	}
	c, err = b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Records()) != 0 {
		t.Errorf("claimed %d published records", len(c.Records()))
	}
	if n := b.count(t, "_messages"); n != 2 {
		t.Errorf("%d rows kept after claim delivery, want 2", n)
	}
}

// TestClaimUnorderedConcurrent drains 5,000 records with 4 concurrent
// claimers; each record must be claimed and delivered exactly once.
func TestClaimUnorderedConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 5000
	msgs := make([]outbox.Message, total)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "drain", Key: fmt.Sprintf("k%d", i%37), Payload: []byte{byte(i)}}
	}
	if err := b.write(t, msgs...); err != nil { // one statement for all
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		errs = make(chan error, 4)
		wg   sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for {
				c, err := b.store.ClaimUnordered(b.ctx, 97, nil)
				if err != nil {
					errs <- err
					return
				}
				recs := c.Records()
				if len(recs) == 0 {
					return // the rest is claimed by others or done
				}
				delivered := make([]string, len(recs))
				mu.Lock()
				for i, r := range recs {
					seen[r.ID]++
					delivered[i] = r.ID
				}
				mu.Unlock()
				if err := c.Settle(b.ctx, outbox.Settlement{Delivered: delivered}); err != nil {
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
	if len(seen) != total {
		t.Errorf("%d distinct records claimed, want %d", len(seen), total)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("record %s claimed %d times", id, n)
		}
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d records left, want 0", n)
	}
}

// TestSettleWaitsForTakeover holds a takeover's lease update uncommitted;
// a concurrent settle under the old epoch must wait on the lease row, then
// be fenced off once the takeover commits.
func TestSettleWaitsForTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.write(t, outbox.Message{Topic: "w", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	lease := b.ownedLease(t, "a", "k")
	recs := b.all(t)

	takeover, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer takeover.Rollback(context.Background())
	if _, err := takeover.Exec(b.ctx, `UPDATE `+b.store.n.leases+` SET owner = 'b', epoch = epoch + 1 WHERE partition = $1`, lease.Partition); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- b.store.Settle(b.ctx, "a", []outbox.Settlement{{Lease: lease, Delivered: []string{recs[0].ID}}})
	}()
	// Wait until the settle is blocked on the lease row lock.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		err := b.store.Pool().QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR SHARE OF l%'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("settle returned %v while the takeover was uncommitted; want it to wait", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the settle never waited on the lease row")
		}
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity, not synchronising
	}
	if err := takeover.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var fe *outbox.FencedError
	if !errors.As(err, &fe) || len(fe.Leases) != 1 || fe.Leases[0] != lease {
		t.Fatalf("settle after a takeover committed: got %v, want a FencedError for %v", err, lease)
	}
	if got := b.all(t); len(got) != 1 {
		t.Fatalf("fenced settle deleted the record")
	}
}

// countingTracer counts the statements run through a pool.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestOneStatement checks that the per-batch operations run one statement
// each, whatever the batch size.
func TestOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := New(pool, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	statements := func(what string, want int64, f func() error) {
		t.Helper()
		before := tracer.n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := tracer.n.Load() - before; got != want {
			t.Errorf("%s ran %d statements, want %d", what, got, want)
		}
	}
	msgs := make([]outbox.Message, 300)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "one", Key: fmt.Sprintf("k%d", i%20)}
	}
	tx, err := pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	statements("Write of 300 messages", 1, func() error { return s.Writer().Write(b.ctx, tx, msgs...) })
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	var leases []outbox.Lease
	statements("AcquireLeases", 1, func() (err error) {
		leases, err = s.AcquireLeases(b.ctx, "n", nil, testPartitions, time.Minute)
		return err
	})
	cursors := make([]outbox.Cursor, len(leases))
	for i, l := range leases {
		cursors[i] = outbox.Cursor{Lease: l}
	}
	var recs []outbox.Record
	statements("Fetch of every partition", 1, func() (err error) {
		recs, err = s.Fetch(b.ctx, cursors, 1000)
		return err
	})
	if len(recs) != 300 {
		t.Fatalf("fetched %d, want 300", len(recs))
	}
	byPart := map[int][]string{}
	for _, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], r.ID)
	}
	var sts []outbox.Settlement
	for _, l := range leases {
		sts = append(sts, outbox.Settlement{Lease: l, Delivered: byPart[l.Partition]})
	}
	// Mixed outcomes in one settlement are still one statement.
	sts[0].Retry = []outbox.Failure{{ID: sts[0].Delivered[0], Attempts: 1, Err: "x"}}
	sts[0].Dead = []outbox.Failure{{ID: sts[0].Delivered[1], Attempts: 1, Err: "y"}}
	sts[0].Delivered = sts[0].Delivered[2:]
	statements("Settle of every partition", 1, func() error { return s.Settle(b.ctx, "n", sts) })
	if n := b.count(t, "_messages"); n != 1 {
		t.Errorf("%d records left, want the retried one", n)
	}
	if n := b.count(t, "_dead_letters"); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// TestQueryPlans checks, on a backlog of 100,000 records, that Fetch reads
// each cursor's partition in seq order from the narrow pending index (no
// sort, no sequential scan), as its EXPLAIN comment says, and that
// Unsettled uses that index too.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A backlog written directly, faster than through Write, with a
	// transaction ID per row as if each had been written alone.
	if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, topic, payload, created_at, txid)
SELECT gen_random_uuid(), i % $1, 'plan', '\x00'::bytea, now(), (1000 + i)::text::xid8 FROM generate_series(1, 100000) AS i`, testPartitions); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "ANALYZE "+b.store.n.messages); err != nil {
		t.Fatal(err)
	}
	// explain returns the generic plan, which knows neither the arrays'
	// lengths nor the limit: PostgreSQL switches to it after five
	// executions when it costs about what the custom plans did.
	explain := func(sql string, args ...any) string {
		t.Helper()
		return b.explainGeneric(t, sql, args...)
	}
	idx := b.opts.TablePrefix + "_messages_pending_idx"
	parts, afters := []int32{0, 1, 2}, []int64{10, 20, 30}
	plan := explain(b.store.q.fetch, parts, afters, outbox.FetchSizeDefault)
	if !strings.Contains(plan, "Index Scan using "+idx) || strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("fetch does not read %s in order:\n%s", idx, plan)
	}
	t.Logf("fetch:\n%s", plan)
	var snap string
	if err := b.store.Pool().QueryRow(b.ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	none, snaps := []string{"", "", ""}, []string{snap, snap, snap}
	for _, args := range [][2]any{
		{none, none}, {snaps, none}, // no marks, marks
		{snaps, snaps}, // late rows cut short: resume at seq 5
	} {
		resumes := []int64{0, 0, 0}
		if args[1].([]string)[0] != "" {
			resumes = []int64{5, 5, 5}
		}
		plan = explain(markedFetchSQL(b.store.n, recordColumns), parts, afters, args[0], outbox.FetchSizeDefault, resumes, args[1])
		t.Logf("marked:\n%s", plan)
		if strings.HasPrefix(plan, "Sort") || !strings.Contains(plan, "Index Scan using "+idx) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("FetchMarked sorts all rows or does not read %s in order:\n%s", idx, plan)
		}
		if txidIdx := b.opts.TablePrefix + "_messages_txid_idx"; !strings.Contains(plan, txidIdx) ||
			strings.Contains(plan, "Index Cond: ((partition = c.p) AND (seq <=") {
			t.Errorf("FetchMarked does not find late rows through %s, or walks the rows below the cursor:\n%s", txidIdx, plan)
		}
	}
	plan = explain(b.store.q.unsettled, parts, afters)
	t.Logf("unsettled:\n%s", plan)
	if !strings.Contains(plan, idx) || strings.Contains(plan, "Seq Scan") {
		t.Errorf("unsettled does not use %s:\n%s", idx, plan)
	}
}

func TestRequeueKeepsRewrittenID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := outbox.Message{ID: outbox.NewID(), Topic: "rq", Key: "k"}
	if err := b.write(t, m); err != nil {
		t.Fatal(err)
	}
	lease := b.ownedLease(t, "n", "k")
	if err := b.store.Settle(b.ctx, "n", []outbox.Settlement{{Lease: lease, Dead: []outbox.Failure{{ID: m.ID, Attempts: 3, Err: "x"}}}}); err != nil {
		t.Fatal(err)
	}
	// The application writes the same ID again; requeueing must not lose
	// the dead letter nor fail.
	if err := b.write(t, m); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.Requeue(b.ctx, outbox.DeadLetterFilter{IDs: []string{m.ID}})
	if err != nil || n != 0 {
		t.Fatalf("Requeue = %d, %v; want 0 (the ID is in the outbox again)", n, err)
	}
	if dl, err := b.store.DeadLetters(b.ctx, outbox.DeadLetterFilter{}); err != nil || len(dl) != 1 {
		t.Fatalf("DeadLetters = %v, %v; want the dead letter kept", dl, err)
	}
	if _, err := b.store.DeadLetters(b.ctx, outbox.DeadLetterFilter{IDs: []string{"nope"}}); err == nil || !strings.Contains(err.Error(), "DeadLetterFilter.IDs[0]") {
		t.Errorf("bad ID filter: got %v, want an error naming DeadLetterFilter.IDs[0]", err)
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.store.Close()
	b.store.Close() // idempotent
	if _, err := b.store.Fetch(b.ctx, []outbox.Cursor{{}}, 1); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Fetch after Close: %v, want ErrClosed", err)
	}
	if _, err := b.store.Heartbeat(b.ctx, "n", time.Second); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Heartbeat after Close: %v, want ErrClosed", err)
	}
	if _, err := b.store.ClaimUnordered(b.ctx, 1, nil); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("ClaimUnordered after Close: %v, want ErrClosed", err)
	}
}

// TestLongNames uses the longest schema and prefix: table, index and
// channel names stay within PostgreSQL's 63-byte limit, and notifications
// still arrive.
func TestLongNames(t *testing.T) {
	t.Parallel()
	schema := "s" + strings.Repeat("x", 62)
	prefix := "p" + strings.Repeat("y", MaxTablePrefixLen-1)
	b := setup(t, Options{Schema: schema, TablePrefix: prefix})
	if c := b.opts.Channel(); len(c) > 63 {
		t.Fatalf("channel %q is %d bytes", c, len(c))
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ch, err := b.store.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.write(t, outbox.Message{Topic: "long"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatal("no notification")
	}
	var idx []string
	rows, err := b.store.Pool().Query(b.ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	if idx, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{prefix + "_messages_pending_idx", prefix + "_messages_published_idx", prefix + "_dead_letters_failed_idx", prefix + "_messages_txid_idx"} {
		if !slices.Contains(idx, want) {
			t.Errorf("index %s missing (truncated?): have %v", want, idx)
		}
	}
	// Every relation the migrations created keeps its full name, and the
	// longest, <prefix>_dead_letters_failed_idx, is exactly 63 bytes: the
	// bound is tight, a prefix one byte longer would be truncated.
	rows, err = b.store.Pool().Query(b.ctx, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'i', 'S')`, schema)
	if err != nil {
		t.Fatal(err)
	}
	rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	longest := ""
	for _, r := range rels {
		if !strings.HasPrefix(r, prefix+"_") {
			t.Errorf("relation %q does not start with the prefix %q", r, prefix)
		}
		if len(r) > len(longest) {
			longest = r
		}
	}
	if longest != prefix+"_dead_letters_failed_idx" || len(longest) != 63 {
		t.Errorf("longest relation name %q (%d bytes), want %s_dead_letters_failed_idx (63 bytes), among %v", longest, len(longest), prefix, rels)
	}
}

// TestSubscribeConnectionLost kills the listening backend: the channel must
// close, so that the relay falls back to polling and subscribes again.
func TestSubscribeConnectionLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.store.Subscribe(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var killed bool
	err = b.store.Pool().QueryRow(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&killed)
	if err != nil || !killed {
		t.Fatalf("terminate the listening backend: %v, %v", killed, err)
	}
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatal("the channel stayed open after the connection died")
		}
	}
}

// A node's lease renewal and its workers' settles lock the same lease rows
// (FOR UPDATE and FOR SHARE); both must lock them in partition order, or
// they deadlock (seen in the bench: "deadlock detected" on settle and on
// acquire leases). Settles and renewals list the partitions in random
// orders, over and over, concurrently.
func TestSettleAndRenewDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 64})
	leases, err := b.store.AcquireLeases(b.ctx, "n", nil, 64, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 64 {
		t.Fatalf("got %d leases, want 64", len(leases))
	}
	shuffled := func(seed uint64) []outbox.Lease {
		ls := slices.Clone(leases)
		rand.New(rand.NewPCG(seed, 7)).Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
		return ls
	}
	const rounds = 150
	var g errgroup.Group
	for w := range 3 {
		g.Go(func() error {
			for i := range rounds {
				var batch []outbox.Settlement
				for _, l := range shuffled(uint64(w*rounds + i)) {
					// Nothing to apply: the statement still locks the lease row.
					batch = append(batch, outbox.Settlement{Lease: l, Delivered: []string{outbox.NewID()}})
				}
				if err := b.store.Settle(b.ctx, "n", batch); err != nil {
					return fmt.Errorf("settle: %w", err)
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		for i := range rounds {
			if _, err := b.store.AcquireLeases(b.ctx, "n", shuffled(uint64(1e6+i)), 0, time.Minute); err != nil {
				return fmt.Errorf("renew: %w", err)
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
