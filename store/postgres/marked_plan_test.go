package postgres

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
)

// TestFetchMarkedPlanIsIndexedWhateverTheStatistics checks FetchMarked's
// generic plan under indexedPlan, with the statistics a relay meets: the
// table analysed while it was empty (the plan a connection caches at
// start and keeps as the table grows), analysed while it held a backlog,
// and analysed empty then grown. Without indexedPlan the plan made on the
// empty table scanned the whole table for every cursor, twice (measured
// at 1,000 msgs/s: 72,683 buffers read for no row, 1.26 s); with it each
// late-row probe is an index lookup with a condition on the transaction
// ID: one per transaction of the mark's xip list, and a range from xmax.
func TestFetchMarkedPlanIsIndexedWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		before, after int // rows when analysed, rows added after
	}{
		{"analysed empty", 0, 0},
		{"analysed with a backlog", 5000, 0},
		{"analysed empty, then grown", 0, 20000},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fill := func(n int) {
				if n == 0 {
					return
				}
				if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, topic, payload, created_at, txid)
SELECT gen_random_uuid(), i % $1, 'plan', '\x00'::bytea, now(), (1000 + i)::text::xid8 FROM generate_series(1, $2) AS i`, testPartitions, n); err != nil {
					t.Fatal(err)
				}
			}
			fill(c.before)
			if _, err := b.store.Pool().Exec(b.ctx, "ANALYZE "+b.store.n.messages); err != nil {
				t.Fatal(err)
			}
			fill(c.after)
			// A mark with transactions in progress, so that the xip
			// probes run (EXPLAIN ANALYZE shows their scans' conditions
			// either way).
			snap := "1000:1500:1010,1020,1030"
			parts, afters := []int32{0, 1, 2}, []int64{10, 20, 30}
			snaps, none := []string{snap, snap, snap}, []string{"", "", ""}
			for _, resumed := range []bool{false, true} {
				resumes, seens := []int64{0, 0, 0}, none
				if resumed {
					resumes, seens = []int64{5, 5, 5}, snaps
				}
				plan := b.explainFetchPlan(t, indexedPlan, markedFetchSQL(b.store.n, recordColumns), parts, afters, snaps, outbox.FetchSizeDefault, resumes, seens)
				if msg := checkIndexedFetchPlan(plan, b.store.n.messages, b.opts.TablePrefix); msg != "" {
					t.Errorf("resumed %v: %s:\n%s", resumed, msg, plan)
				}
			}
		})
	}
}

// checkIndexedFetchPlan returns what is wrong with a marked fetch's plan,
// or "".
func checkIndexedFetchPlan(plan, table, prefix string) string {
	txidIdx := prefix + "_messages_txid_idx"
	for _, bad := range []string{"Seq Scan on " + table, "Seq Scan on " + prefix + "_messages", "Bitmap"} {
		if strings.Contains(plan, bad) {
			return fmt.Sprintf("the plan has a %q", bad)
		}
	}
	lines := strings.Split(plan, "\n")
	probes := 0
	for i, l := range lines {
		if !strings.Contains(l, "using "+txidIdx) {
			continue
		}
		cond := ""
		for _, next := range lines[i+1:] {
			if c, ok := strings.CutPrefix(strings.TrimSpace(next), "Index Cond: "); ok {
				cond = c
				break
			}
		}
		if !strings.Contains(cond, "txid") {
			return fmt.Sprintf("a scan of %s without a condition on txid (Index Cond: %s) walks the whole partition", txidIdx, cond)
		}
		if strings.Contains(cond, "txid = x.txid") {
			probes++
		}
	}
	if probes == 0 {
		return "the transactions of the xip list are not looked up one by one through " + txidIdx
	}
	return ""
}

// explainFetchPlan returns the generic plan of sql for args as the relay
// runs it: in a transaction that first ran setup.
func (b *bundle) explainFetchPlan(t *testing.T, setup, sql string, args ...any) string {
	t.Helper()
	tx, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // test cleanup
	for _, q := range []string{setup, "SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE explained AS " + sql} {
		if _, err := tx.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer b.store.Pool().Exec(b.ctx, "DEALLOCATE ALL") //nolint:errcheck // test cleanup (the statement outlives the transaction, on a connection of the pool)
	lits := make([]string, len(args))
	for i, a := range args {
		lits[i] = sqlLiteral(t, a)
	}
	rows, err := tx.Query(b.ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE explained("+strings.Join(lits, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(b.ctx, "DEALLOCATE explained"); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestQueryIndexedSettingsLastOneStatement: the fetch's settings hold for
// the fetch and end with it, whatever the pool's query mode (a pool given
// to New may use the simple protocol, for PgBouncer, or unnamed
// statements) and on the ring layout; the connection goes back to the
// pool with its own settings.
func TestQueryIndexedSettingsLastOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgxpool.ParseConfig(b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		s, err := New(pool, b.opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, ring := range []bool{false, true} {
			s.ringLayout.Store(ring)
			for range 3 { // both connections of the pool
				rows, finish, err := s.queryIndexed(b.ctx, "SELECT current_setting('enable_seqscan') || ' ' || current_setting('enable_bitmapscan') || ' ' || current_setting('plan_cache_mode') || ' ' || $1::text", "x")
				if err != nil {
					t.Fatal(err)
				}
				got, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				if err := finish(); err != nil {
					t.Fatal(err)
				}
				if got != "off off force_generic_plan x" {
					t.Errorf("mode %v, ring %v: in the fetch, enable_seqscan, enable_bitmapscan, plan_cache_mode and the parameter = %q, want off off force_generic_plan x", mode, ring, got)
				}
				var after string
				if err := pool.QueryRow(b.ctx, "SELECT current_setting('enable_seqscan')").Scan(&after); err != nil {
					t.Fatal(err)
				}
				if after != "on" {
					t.Errorf("mode %v, ring %v: after the fetch, enable_seqscan = %q on a connection of the pool, want on", mode, ring, after)
				}
			}
		}
	}
}

// TestFetchMarkedReturnsLateRowsOfLaterTransactions: a row below the
// cursor whose transaction started after the mark (txid >= its xmax), as
// a plain INSERT that draws its seq before its transaction ID can make,
// comes back as a late row through the xmax range of the late-row lookup.
func TestFetchMarkedReturnsLateRowsOfLaterTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 1})
	first := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := b.write(t, first); err != nil {
		t.Fatal(err)
	}
	leases, err := b.store.AcquireLeases(b.ctx, "n", nil, 1, time.Minute)
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases %v, %v", leases, err)
	}
	recs, mark, err := b.store.FetchMarked(b.ctx, []outbox.Cursor{{Lease: leases[0]}}, 100)
	if err != nil || len(recs) != 1 {
		t.Fatalf("first fetch = %v, %v", recs, err)
	}
	cursor := outbox.Cursor{Lease: leases[0], After: recs[0].Seq, Mark: mark}
	late := outbox.NewID()
	if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, seq, topic, payload, created_at, txid)
OVERRIDING SYSTEM VALUE VALUES ($1, 0, $2, 't', '\x00'::bytea, now(), pg_current_xact_id())`, late, recs[0].Seq-1); err != nil {
		t.Fatal(err)
	}
	recs, _, err = b.store.FetchMarked(b.ctx, []outbox.Cursor{cursor}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != late {
		t.Fatalf("fetch after a later transaction wrote below the cursor = %v, want its row %s", recs, late)
	}
}
