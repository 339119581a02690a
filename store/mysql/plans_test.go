package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/outboxrelay/outbox"
)

// TestQueryPlans checks the plans the comment of queries states: the
// per-batch statements use their index, with a range, on a table of a
// few thousand rows.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var msgs []outbox.Message
	for i := range 2000 {
		msgs = append(msgs, outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprint(i % 50)})
	}
	for i := 0; i < len(msgs); i += 500 {
		if err := b.write(ctx, msgs[i:i+500]...); err != nil {
			t.Fatal(err)
		}
	}
	ids := []any{1}
	for _, m := range msgs[:100] {
		ids = append(ids, m.ID)
	}
	for _, tc := range []struct {
		name, query, key string
		args             []any
	}{
		{"settle delete", b.store.q.deleteIn + placeholders(100) + ")", "id_idx", ids},
		{"settle publish", b.store.q.publishIn + placeholders(100) + ")", "id_idx", ids},
		{"fetch", unionOf(b.store.q.fetchOne, 2), "pending_idx", []any{1, 0, 500, 2, 0, 500}},
		{"dirty read", unionOf(b.store.q.dirtyOne, 2), "pending_idx", []any{1, 0, 1000, 2, 0, 1000}},
		{"unsettled", b.store.q.unsetOne, "pending_idx", []any{1, 100000}},
		{"cleanup", b.store.q.cleanup, "published_idx", []any{1, 10}},
	} {
		rows, err := b.store.DB().QueryContext(ctx, "EXPLAIN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			row := map[string]string{}
			for i, c := range cols {
				row[c] = vals[i].String
			}
			if row["table"] == "" || row["table"] == "<union1,2>" {
				continue
			}
			if row["key"] != tc.key || row["type"] != "range" {
				t.Errorf("%s: plan %v, want a range on %s", tc.name, row, tc.key)
			}
		}
		rows.Close()
	}
}
