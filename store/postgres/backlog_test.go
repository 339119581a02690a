package postgres

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// fillBacklog inserts n outstanding rows over 20 topics and every
// partition, as fast as the server can, and analyzes the table.
func (b *bundle) fillBacklog(t testing.TB, n int) {
	t.Helper()
	if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, topic, key, payload, created_at)
SELECT gen_random_uuid(), i % (SELECT partitions FROM `+b.store.n.meta+`), 'topic.' || (i % 20), 'k' || (i % 10000),
       convert_to(repeat('x', 200), 'UTF8'), now() - interval '1 hour' + i * interval '1 ms'
FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "VACUUM ANALYZE "+b.store.n.messages); err != nil {
		t.Fatal(err)
	}
}

// TestBacklogPlans checks that Backlog reads the head of each partition
// through the pending index and stops its scans at the limit, so that its
// cost does not grow with the outbox, and that Leases reads no outbox row.
func TestBacklogPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fillBacklog(t, 100000)
	q := newBacklogSQL(b.store.n)
	idx := b.opts.TablePrefix + "_messages_pending_idx"
	plan := b.explain(t, q.heads)
	t.Logf("heads:\n%s", plan)
	if !strings.Contains(plan, "Index Scan using "+idx) || strings.Contains(plan, "Seq Scan on") && !strings.Contains(plan, "Seq Scan on "+b.opts.TablePrefix+"_meta") {
		t.Errorf("heads does not probe %s once per partition:\n%s", idx, plan)
	}
	plan = b.explain(t, q.sample, 1000, outbox.BacklogTopicsMax+1)
	t.Logf("sample:\n%s", plan)
	lines := strings.Split(plan, "\n")
	limitAboveScan := false
	for i := 1; i < len(lines); i++ {
		if strings.Contains(lines[i], "Scan on "+b.opts.TablePrefix+"_messages") && strings.Contains(lines[i-1], "Limit") {
			limitAboveScan = true
		}
	}
	if !limitAboveScan {
		t.Errorf("sample does not stop its scan at the limit:\n%s", plan)
	}
	plan = b.explain(t, q.dead, 1000)
	t.Logf("dead:\n%s", plan)
	if !strings.Contains(plan, "Limit") {
		t.Errorf("dead does not stop at the limit:\n%s", plan)
	}
	plan = b.explain(t, leasesSQL(b.store.n))
	t.Logf("leases:\n%s", plan)
	if strings.Contains(plan, b.opts.TablePrefix+"_messages") || !strings.Contains(plan, b.opts.TablePrefix+"_leases") {
		t.Errorf("leases (Leases, and Backlog's leases) reads more than the leases and relays tables:\n%s", plan)
	}

	got, err := b.store.Backlog(b.ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if got.Exact || got.Outstanding < 1000 || got.Outstanding > 1000+int64(testPartitions) || len(got.Topics) != 20 {
		t.Errorf("Backlog(1000) of 100,000 rows: Exact %v, Outstanding %d, %d topics; want a sample of about 1,000 over 20 topics", got.Exact, got.Outstanding, len(got.Topics))
	}
	all, err := b.store.Backlog(b.ctx, 200000)
	if err != nil {
		t.Fatal(err)
	}
	if !all.Exact || all.Outstanding != 100000 || len(all.Topics) != 20 || all.Topics[0].Outstanding != 5000 {
		t.Errorf("Backlog(200000) of 100,000 rows: Exact %v, Outstanding %d, topics %v; want exact, 100,000, 20 × 5,000", all.Exact, all.Outstanding, all.Topics)
	}
	if !got.OldestCreatedAt.Equal(all.OldestCreatedAt) {
		t.Errorf("oldest message: %v from the sample with heads, %v from a full count", got.OldestCreatedAt, all.OldestCreatedAt)
	}
}

// BenchmarkBacklog measures one Backlog call (the default limit) on an
// outbox of OUTBOX_BENCH_BACKLOG_ROWS outstanding rows (default 100,000)
// over 20 topics and 64 partitions:
//
//	OUTBOX_BENCH_BACKLOG_ROWS=1000000 go test ./store/postgres -run '^$' -bench Backlog -benchtime 20x
func BenchmarkBacklog(b *testing.B) {
	rows := 100000
	if s := os.Getenv("OUTBOX_BENCH_BACKLOG_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			b.Fatalf("OUTBOX_BENCH_BACKLOG_ROWS=%q: want a number of rows", s)
		}
		rows = n
	}
	bu := setup(b, Options{Partitions: 64})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // setup's minute is too short to fill millions
	defer cancel()
	bu.ctx = ctx
	bu.fillBacklog(b, rows)
	for _, limit := range []int{outbox.BacklogScanLimitDefault, 10 * outbox.BacklogScanLimitDefault} {
		b.Run("limit="+strconv.Itoa(limit), func(b *testing.B) {
			var got *outbox.Backlog
			for b.Loop() {
				var err error
				if got, err = bu.store.Backlog(bu.ctx, limit); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(got.Outstanding), "counted")
		})
	}
}
