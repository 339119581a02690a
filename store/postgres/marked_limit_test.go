package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// TestFetchMarkedLimitsLateCommits: a bulk transaction (20,000 rows) that
// commits after a fetch moved the cursors past its rows comes back through
// the mark, but at most limit records per partition per fetch, and
// draining returns every record once, each key in seq order: the late
// rows of a key before its later rows. Two small transactions commit in
// the middle of the drain, one below the bulk's rows and one above them.
func TestFetchMarkedLimitsLateCommits(t *testing.T) {
	t.Parallel()
	const (
		parts = 2
		bulk  = 20000
		limit = 10
	)
	b := setup(t, Options{Partitions: parts})
	// About 2,000 fetches of 10 rows, each reading the late transaction's
	// rows through the txid index: more than setup's minute on a loaded
	// machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ctx = ctx
	leases, err := b.store.AcquireLeases(b.ctx, "n", nil, parts, time.Hour)
	if err != nil || len(leases) != parts {
		t.Fatalf("leases %v, %v", leases, err)
	}
	begin := func(msgs ...outbox.Message) pgx.Tx {
		t.Helper()
		tx, err := b.store.Pool().Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(b.ctx) })
		if err := b.store.Writer().Write(b.ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	keyed := func(n int, key func(i int) string) []outbox.Message {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key(i)}
		}
		return msgs
	}
	// Seq order of the inserts: E (1 row), A (the bulk), D (5 rows), B.
	txE := begin(keyed(1, func(int) string { return "e" })...)
	txA := begin(keyed(bulk, func(i int) string { return fmt.Sprintf("k%d", i%200) })...)
	txD := begin(keyed(5, func(i int) string { return fmt.Sprintf("d%d", i) })...)
	if err := b.write(t, keyed(10, func(i int) string { return fmt.Sprintf("b%d", i) })...); err != nil {
		t.Fatal(err)
	}

	cursors := make([]outbox.Cursor, parts)
	for i, l := range leases {
		cursors[i] = outbox.Cursor{Lease: l}
	}
	got := map[string]int{}         // ID → times returned
	keySeqs := map[string][]int64{} // key → seqs in the order returned
	total := 0
	fetch := func() int {
		t.Helper()
		recs, mark, err := b.store.FetchMarked(b.ctx, cursors, limit)
		if err != nil {
			t.Fatal(err)
		}
		per := map[int]int{}
		for _, r := range recs {
			per[r.Partition]++
			got[r.ID]++
			keySeqs[r.Key] = append(keySeqs[r.Key], r.Seq)
		}
		for p, n := range per {
			if n > limit {
				t.Fatalf("fetch %d returned %d records of partition %d, limit %d", total, n, p, limit)
			}
		}
		for i := range cursors { // as the relay does
			for _, r := range recs {
				if r.Partition == cursors[i].Partition && r.Seq > cursors[i].After {
					cursors[i].After = r.Seq
				}
			}
			cursors[i].Mark = mark
		}
		total++
		return len(recs)
	}
	if n := fetch(); n != 10 {
		t.Fatalf("first fetch returned %d records, want B's 10", n)
	}
	if err := txA.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	// C: later records of the bulk's keys, committed after it.
	if err := b.write(t, keyed(200, func(i int) string { return fmt.Sprintf("k%d", i) })...); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if i == 3 {
			if err := txE.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			if err := txD.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
		}
		if fetch() == 0 && i > 3 {
			break
		}
		if i > 2*bulk/limit {
			t.Fatalf("still fetching after %d fetches", total)
		}
	}
	if want := 1 + bulk + 5 + 10 + 200; len(got) != want {
		t.Fatalf("drained %d distinct records in %d fetches, want %d", len(got), total, want)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("record %s returned %d times", id, n)
		}
	}
	for key, seqs := range keySeqs {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("key %s: seq %d returned after seq %d", key, seqs[i], seqs[i-1])
			}
		}
	}
	t.Logf("drained %d records in %d fetches of limit %d", len(got), total, limit)
}

// TestRelayDrainsLateBulkWithoutPolling: a relay whose fetches return a
// late bulk transaction limit rows at a time fetches again at once, as it
// does for a backlog above its cursor, instead of waiting for the next
// poll (an hour here) or write.
func TestRelayDrainsLateBulkWithoutPolling(t *testing.T) {
	t.Parallel()
	const bulk = 2000
	b := setup(t, Options{Partitions: 2})
	txA, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(context.Background())
	msgs := make([]outbox.Message, bulk)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprintf("k%d", i%50)}
	}
	if err := b.store.Writer().Write(b.ctx, txA, msgs...); err != nil {
		t.Fatal(err)
	}
	first := []outbox.Message{{ID: outbox.NewID(), Topic: "t", Key: "b0"}, {ID: outbox.NewID(), Topic: "t", Key: "b1"}}
	if err := b.write(t, first...); err != nil {
		t.Fatal(err)
	}
	rec := &relaytest.Recorder{}
	r, err := outbox.NewRelay(b.store, rec, outbox.Config{
		Node: "n", Workers: 1, BatchSize: 10, FetchSize: 20,
		PollInterval: time.Hour, SweepInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	relaytest.WaitFor(t, "the first writes published", time.Minute, func() bool { return len(rec.IDs()) == len(first) })
	if err := txA.Commit(b.ctx); err != nil { // one notification
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the late bulk published", time.Minute, func() bool { return len(rec.IDs()) == len(first)+bulk })
	pos := map[string]int{}
	for i, id := range rec.IDs() {
		pos[id] = i
	}
	last := map[string]int{}
	for _, m := range msgs {
		p, ok := pos[m.ID]
		if !ok {
			t.Fatalf("%s not published", m.ID)
		}
		if q, seen := last[m.Key]; seen && p < q {
			t.Fatalf("key %s published out of order", m.Key)
		}
		last[m.Key] = p
	}
}
