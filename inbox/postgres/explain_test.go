package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/inbox/postgres"
)

// TestCleanupPlan checks that the cleanup batch reads the processed_at index
// rather than scanning the table.
func TestCleanupPlan(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	ctx := context.Background()
	// Enough rows that a sequential scan is not the cheapest plan.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.in.Table()+` (consumer, message_id, processed_at)
		SELECT 'c', g::text, now() - g * interval '1 second' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE `+b.in.Table()); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `EXPLAIN `+postgres.CleanupSQL(b.in), (time.Hour).Microseconds(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "app_inbox_processed_idx") || !strings.Contains(text, "Tid Scan") || strings.Contains(text, "Seq Scan") {
		t.Fatalf("cleanup plan does not use the processed_at index:\n%s", text)
	}
	t.Logf("cleanup plan:\n%s", text)
}
