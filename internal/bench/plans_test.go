package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// explain returns the text plan of sql with args.
func explain(t *testing.T, env *Env, sql string, args ...any) string {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", sql, err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestSeedPlans checks that the seeds run the plans the article describes
// (the comments on the queries): the naive query sorts a sequential scan,
// the tuned one walks the covering index; and that the store ceiling reads
// through our pending index.
func TestSeedPlans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := NewEnv(ctx, testenv.PostgresDSN(t), nil, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	k := Knobs{Messages: 20000, Payload: PayloadDefault, Keys: 100, Batch: 500, Workers: 4}
	if err := env.prepareSeed(ctx, env.naiveSchema, k, k.Messages); err != nil {
		t.Fatal(err)
	}
	if err := env.prepareSeed(ctx, env.tunedSchema, k, k.Messages); err != nil {
		t.Fatal(err)
	}
	if err := env.prepareOurs(ctx, k, k.Messages); err != nil {
		t.Fatal(err)
	}

	naive := explain(t, env, seedNaiveSelect(seedTable(env.naiveSchema)))
	for _, want := range []string{"Sort", "Seq Scan on outbox_messages"} {
		if !strings.Contains(naive, want) {
			t.Errorf("naive plan lacks %q:\n%s", want, naive)
		}
	}
	if strings.Contains(naive, "Index") {
		t.Errorf("naive plan uses an index; the article's starting table has none but the primary key:\n%s", naive)
	}

	tuned := explain(t, env, seedTunedSelect(seedTable(env.tunedSchema)), SeedBatch)
	for _, want := range []string{"LockRows", "idx_outbox_messages_unprocessed"} {
		if !strings.Contains(tuned, want) {
			t.Errorf("tuned plan lacks %q:\n%s", want, tuned)
		}
	}
	if strings.Contains(tuned, "Sort") {
		t.Errorf("tuned plan sorts; the covering index should give the order:\n%s", tuned)
	}

	fetch := explain(t, env, ceilingFetchSQL(env.messages), []int32{0, 1}, []int64{0, 0}, 250)
	if !strings.Contains(fetch, "outbox_messages_pending_idx") {
		t.Errorf("ceiling fetch does not use the pending index:\n%s", fetch)
	}
	t.Logf("naive:\n%s\ntuned:\n%s\nceiling fetch:\n%s", naive, tuned, fetch)
}

// TestSeedTunedRefusesBigPayloads checks the article's warning: the
// covering index INCLUDEs the payload, and a row over the btree limit
// cannot be written; the error says what to change.
func TestSeedTunedRefusesBigPayloads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env, err := NewEnv(ctx, testenv.PostgresDSN(t), nil, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	k := Knobs{Messages: 10, Payload: 3000, Keys: 10, Batch: 10, Workers: 1}
	err = env.prepareSeed(ctx, env.tunedSchema, k, k.Messages)
	if err == nil || !strings.Contains(err.Error(), "--payload") {
		t.Fatalf("writing 3,000-byte payloads under the covering index: %v, want an error naming --payload", err)
	}
	if err := env.prepareSeed(ctx, env.naiveSchema, k, k.Messages); err != nil {
		t.Errorf("the naive table has no such index, yet: %v", err)
	}
}
