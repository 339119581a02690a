package postgres

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"
)

// TestFetchMarkedProbesLateRowsByTxid checks that FetchMarked's generic
// plan looks for late rows through the txid index with a condition on the
// transaction ID, on a small table too: there, given "txid = ANY (…) OR
// txid >= …", PostgreSQL chose to walk every index entry of the partition
// (Index Cond: (partition = c.p) alone, the rest a filter), which a relay
// then kept doing on every fetch as the table grew: at 5,000 msgs/s the
// fetch took 30 ms per call. Two branches, one condition each, bound both
// scans.
func TestFetchMarkedProbesLateRowsByTxid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, topic, payload, created_at, txid)
SELECT gen_random_uuid(), i % $1, 'plan', '\x00'::bytea, now(), (1000 + i)::text::xid8 FROM generate_series(1, 5000) AS i`, testPartitions); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "ANALYZE "+b.store.n.messages); err != nil {
		t.Fatal(err)
	}
	var snap string
	if err := b.store.Pool().QueryRow(b.ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	parts, afters := []int32{0, 1, 2}, []int64{10, 20, 30}
	snaps, none := []string{snap, snap, snap}, []string{"", "", ""}
	for _, resumed := range []bool{false, true} {
		resumes, seens := []int64{0, 0, 0}, none
		if resumed {
			resumes, seens = []int64{5, 5, 5}, snaps
		}
		plan := b.explainGeneric(t, markedFetchSQL(b.store.n, recordColumns), parts, afters, snaps, outbox.FetchSizeDefault, resumes, seens)
		txidIdx := b.opts.TablePrefix + "_messages_txid_idx"
		lines := strings.Split(plan, "\n")
		scans := 0
		for i, l := range lines {
			if !strings.Contains(l, " on "+txidIdx) && !strings.Contains(l, "using "+txidIdx) {
				continue
			}
			scans++
			cond := ""
			for _, next := range lines[i+1:] {
				if c, ok := strings.CutPrefix(strings.TrimSpace(next), "Index Cond: "); ok {
					cond = c
					break
				}
			}
			if !strings.Contains(cond, "txid") {
				t.Errorf("resumed %v: a scan of %s without a condition on txid (Index Cond: %s) walks the whole partition:\n%s", resumed, txidIdx, cond, plan)
			}
		}
		t.Logf("resumed %v:\n%s", resumed, plan)
		if scans == 0 {
			t.Errorf("resumed %v: late rows not looked up through %s:\n%s", resumed, txidIdx, plan)
		}
	}
}
