package postgres

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// A claim looks at the recent IDs first (claimRecent), and at the older
// ones when the recent ones give nothing: records whose IDs are old (a
// long transaction, a skewed clock, an ID that is not UUIDv7) are claimed
// too, and a claim comes back empty only when nothing is claimable.
func TestClaimOlderIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := func(ago time.Duration) string { return uuid.Format(uuidAt(time.Now().Add(-ago)).Bytes) }
	ids := func(c outbox.Claim) []string {
		var out []string
		for _, r := range c.Records() {
			out = append(out, r.ID)
		}
		slices.Sort(out)
		return out
	}
	hour, day := old(time.Hour), old(24*time.Hour)
	notV7 := "ffffffff-ffff-4fff-bfff-ffffffffffff" // above every UUIDv7 of today
	if err := b.write(t, outbox.Message{ID: hour, Topic: "t"}, outbox.Message{ID: day, Topic: "t"}, outbox.Message{ID: notV7, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	recent := outbox.NewID()
	if err := b.write(t, outbox.Message{ID: recent, Topic: "t"}); err != nil {
		t.Fatal(err)
	}

	// A claim of 2 finds 2 recent IDs (notV7 sorts above today's): the
	// older ones are not needed.
	c1, err := b.store.ClaimUnordered(b.ctx, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(c1), []string{recent, notV7}; !slices.Equal(got, want) {
		t.Fatalf("first claim: %v, want the recent IDs %v", got, want)
	}
	// Every recent ID is held: the next claim finds the older ones.
	c2, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(c2), []string{day, hour}; !slices.Equal(got, want) {
		t.Fatalf("second claim: %v, want the old IDs %v", got, want)
	}
	// Nothing left to claim: empty.
	c3, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(c3.Records()); n != 0 {
		t.Fatalf("third claim: %d records, want none: all are held", n)
	}
	if err := c1.Settle(b.ctx, outbox.Settlement{Delivered: ids(c1)}); err != nil {
		t.Fatal(err)
	}
	if err := c2.Release(b.ctx); err != nil {
		t.Fatal(err)
	}
	// Released, the old ones are claimed again, with no recent ID left.
	c4, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Release(b.ctx)
	if got, want := ids(c4), []string{day, hour}; !slices.Equal(got, want) {
		t.Fatalf("claim after release: %v, want %v", got, want)
	}
}

// uuidAt is the least UUIDv7 of its millisecond.
func TestUUIDAt(t *testing.T) {
	at := time.UnixMilli(0x0190f1b47c8e)
	if got, want := uuid.Format(uuidAt(at).Bytes), "0190f1b4-7c8e-0000-0000-000000000000"; got != want {
		t.Errorf("uuidAt = %s, want %s", got, want)
	}
	id := outbox.NewID()
	if now := uuid.Format(uuidAt(time.Now().Add(-time.Second)).Bytes); !(now < id) {
		t.Errorf("uuidAt(a second ago) = %s, not below a new ID %s", now, id)
	}
}

// TestClaimRunsItsGenericPlan checks that a claim's transaction runs the
// claim's generic plan (planned once per connection, not on every call),
// and that this plan is the index scan on the primary key the claim query
// describes, which stops after LIMIT rows.
func TestClaimRunsItsGenericPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO `+b.store.n.messages+` (id, partition, topic, payload, created_at, txid)
SELECT gen_random_uuid(), i % $1, 'plan', '\x00'::bytea, now(), (1000 + i)::text::xid8 FROM generate_series(1, 5000) AS i`, testPartitions); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "ANALYZE "+b.store.n.messages); err != nil {
		t.Fatal(err)
	}
	tx, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(b.ctx, claimPlan); err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := tx.QueryRow(b.ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "force_generic_plan" {
		t.Errorf("plan_cache_mode in a claim's transaction = %q, want force_generic_plan", mode)
	}
	bound := uuid.Format(uuidAt(time.Now().Add(-claimRecent)).Bytes)
	for _, q := range []string{b.store.q.claimNew, b.store.q.claimOld} {
		if _, err := tx.Exec(b.ctx, "PREPARE claimed AS "+q); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(b.ctx, "EXPLAIN EXECUTE claimed(10, '{}', '"+bound+"')")
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.HasPrefix(plan, "Limit") || !strings.Contains(plan, "LockRows") ||
			!strings.Contains(plan, "Index Scan using "+b.opts.TablePrefix+"_messages_pkey") || strings.Contains(plan, "Sort") {
			t.Errorf("the claim's generic plan is not Limit → LockRows → Index Scan on the primary key:\n%s", plan)
		}
		if _, err := tx.Exec(b.ctx, "DEALLOCATE claimed"); err != nil {
			t.Fatal(err)
		}
	}
}
