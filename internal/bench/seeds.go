package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// The seeds' SQL, as the article writes it (Dapper's @Name parameters
// become $n). The table lives in a schema of the bench's own; the names
// below are otherwise the article's.

// seedTable returns the quoted name of the seed table in schema.
func seedTable(schema string) string { return pgx.Identifier{schema, "outbox_messages"}.Sanitize() }

// seedTableSQL creates the article's table: no index but the primary key.
func seedTableSQL(table string) string {
	return `CREATE TABLE ` + table + ` (
    id               uuid PRIMARY KEY,
    type             text NOT NULL,
    content          jsonb NOT NULL,
    occurred_on_utc  timestamptz NOT NULL,
    processed_on_utc timestamptz NULL,
    error            text NULL
)`
}

// seedIndexSQL creates the article's covering partial index, exactly as
// written. INCLUDE (content) puts the payload into the index: rows bigger
// than 2,712 bytes (PostgreSQL's btree limit, after compression) cannot be
// inserted, the article's own warning.
func seedIndexSQL(schema string) string {
	return `CREATE INDEX IF NOT EXISTS idx_outbox_messages_unprocessed
ON ` + seedTable(schema) + ` (occurred_on_utc, processed_on_utc)
INCLUDE (id, type, content)
WHERE processed_on_utc IS NULL`
}

// seedNaiveSelect is the naive processor's query. Plan (PostgreSQL 15, no
// index but the primary key; checked by TestSeedPlans): a top-N sort of a
// sequential scan of the whole table, processed rows included.
//
//	Limit
//	  ->  Sort (Sort Key: occurred_on_utc)
//	        ->  Seq Scan on outbox_messages (Filter: processed_on_utc IS NULL)
func seedNaiveSelect(table string) string {
	return `SELECT * FROM ` + table + `
WHERE processed_on_utc IS NULL
ORDER BY occurred_on_utc
LIMIT ` + strconv.Itoa(SeedBatch)
}

// seedNaiveUpdate marks one message processed; seedNaiveUpdateError
// records a failed publish (the article marks it processed too, with the
// error: the message is not published again).
func seedNaiveUpdate(table string) string {
	return `UPDATE ` + table + ` SET processed_on_utc = now() WHERE id = $1`
}

func seedNaiveUpdateError(table string) string {
	return `UPDATE ` + table + ` SET processed_on_utc = now(), error = $2 WHERE id = $1`
}

// seedTunedSelect is the final processor's query: only the needed
// columns, oldest first, skipping rows other processors hold. Plan
// (PostgreSQL 15; checked by TestSeedPlans):
//
//	Limit
//	  ->  LockRows
//	        ->  Index Scan using idx_outbox_messages_unprocessed on outbox_messages
func seedTunedSelect(table string) string {
	return `SELECT id, type, content FROM ` + table + `
WHERE processed_on_utc IS NULL
ORDER BY occurred_on_utc
LIMIT $1
FOR UPDATE SKIP LOCKED`
}

// seedTunedUpdate is the article's batched update of n rows: one UPDATE …
// FROM (VALUES (id, processed_on_utc, error), …), 3n parameters.
func seedTunedUpdate(table string, n int) string {
	var b strings.Builder
	b.WriteString(`UPDATE ` + table + ` SET processed_on_utc = v.processed_on_utc, error = v.error
FROM (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		p := 3*i + 1
		if i == 0 {
			fmt.Fprintf(&b, "($%d::uuid, $%d::timestamptz, $%d::text)", p, p+1, p+2)
		} else {
			fmt.Fprintf(&b, "($%d, $%d, $%d)", p, p+1, p+2)
		}
	}
	b.WriteString(`) AS v(id, processed_on_utc, error)
WHERE ` + table + `.id = v.id`)
	return b.String()
}

// prepareSeed empties the seed table of schema and writes a backlog of n
// messages in big transactions: random (v4) IDs like the article's
// Guid.NewGuid(), occurred_on_utc increasing.
func (e *Env) prepareSeed(ctx context.Context, schema string, k Knobs, n int) error {
	e.meter.start("writing", n)
	table := seedTable(schema)
	if _, err := e.Pool.Exec(ctx, `TRUNCATE `+table); err != nil {
		return fmt.Errorf("bench: empty the seed table: %w", err)
	}
	insert := `INSERT INTO ` + table + ` (id, type, content, occurred_on_utc)
SELECT u.id, u.type, u.content::jsonb, u.occurred
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[]) AS u(id, type, content, occurred)`
	base := time.Now()
	for i := 0; i < n; i += writeChunk {
		m := min(n, i+writeChunk) - i
		ids := make([][16]byte, m)
		types := make([]string, m)
		contents := make([]string, m)
		occurred := make([]time.Time, m)
		for j := range m {
			ids[j] = uuidV4()
			types[j] = Topic
			contents[j] = string(e.payloadFor(k, i+j))
			occurred[j] = base.Add(time.Duration(i+j) * time.Microsecond)
		}
		if _, err := e.Pool.Exec(ctx, insert, ids, types, contents, occurred); err != nil {
			if strings.Contains(err.Error(), "index row") {
				return fmt.Errorf("bench: write the seed backlog: %w (the article's covering index INCLUDEs the payload, so payloads near 2,712 bytes do not fit: lower --payload)", err)
			}
			return fmt.Errorf("bench: write the seed backlog: %w", err)
		}
		e.meter.done.Add(int64(m))
	}
	return e.settle(ctx, table)
}

// leftSeed counts the unprocessed messages of a seed table.
func (e *Env) leftSeed(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+seedTable(schema)+` WHERE processed_on_utc IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("bench: count the seed table: %w", err)
	}
	return n, nil
}

// SeedNaive runs the article's starting processor on a backlog of
// k.Messages: 1 worker, batches of 1,000 in one transaction each, SELECT *
// without an index, one Publish per message awaiting its confirmation, one
// UPDATE per message. k.Batch and k.Workers do not apply.
func SeedNaive(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	if err := env.prepareSeed(ctx, env.naiveSchema, k, n); err != nil {
		return RunResult{}, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	pub, err := env.Broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	table := seedTable(env.naiveSchema)
	sel, upd, updErr := seedNaiveSelect(table), seedNaiveUpdate(table), seedNaiveUpdateError(table)

	var failed int64
	cpu := newCPUMeter(ctx, env)
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	for {
		done, f, err := naiveBatch(tctx, env, pub, sel, upd, updErr)
		if err != nil {
			untimed()
			return RunResult{}, fmt.Errorf("bench: seed-naive: %w", err)
		}
		failed += f
		if done == 0 {
			break
		}
		env.meter.done.Add(int64(done))
	}
	r := newRun(n, time.Since(start))
	r.setCPU(cpu.end(), benchRelays)
	untimed()
	r.Failed = failed
	if r.Left, err = env.leftSeed(ctx, env.naiveSchema); err != nil {
		return r, err
	}
	return env.finish(ctx, r)
}

// naiveBatch processes one batch; it returns how many rows it processed
// and how many publishes failed.
func naiveBatch(ctx context.Context, env *Env, pub outbox.Publisher, sel, upd, updErr string) (int, int64, error) {
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, sel)
	if err != nil {
		return 0, 0, err
	}
	type row struct {
		id        [16]byte
		typ       string
		content   []byte
		occurred  time.Time
		processed *time.Time
		err       *string
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.typ, &x.content, &x.occurred, &x.processed, &x.err)
		return x, err
	})
	if err != nil {
		return 0, 0, err
	}
	var failed int64
	for _, x := range batch {
		m := &outbox.Message{ID: uuid.Format(x.id), Topic: x.typ, Payload: x.content, CreatedAt: x.occurred}
		if perr := pub.Publish(ctx, []*outbox.Message{m})[0]; perr != nil {
			failed++
			if _, err := tx.Exec(ctx, updErr, x.id, perr.Error()); err != nil {
				return 0, 0, err
			}
			continue
		}
		if _, err := tx.Exec(ctx, upd, x.id); err != nil {
			return 0, 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	return len(batch), failed, nil
}

// SeedTuned runs the article's final processor on a backlog of
// k.Messages: 5 workers, each claiming 1,000 rows with FOR UPDATE SKIP
// LOCKED through the covering index, publishing them with one Publish call
// (all in flight together), and marking them with one UPDATE … FROM
// (VALUES …), holding its transaction across the broker call. k.Batch and
// k.Workers do not apply.
func SeedTuned(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	if err := env.prepareSeed(ctx, env.tunedSchema, k, n); err != nil {
		return RunResult{}, err
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	pub, err := env.Broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	table := seedTable(env.tunedSchema)
	sel := seedTunedSelect(table)
	var (
		mu      sync.Mutex
		updates = map[int]string{} // batch size → statement
		failed  int64
	)
	update := func(n int) string {
		mu.Lock()
		defer mu.Unlock()
		if s, ok := updates[n]; ok {
			return s
		}
		s := seedTunedUpdate(table, n)
		updates[n] = s
		return s
	}

	cpu := newCPUMeter(ctx, env)
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	g, gctx := errgroup.WithContext(tctx)
	for range SeedTunedWorkers {
		g.Go(func() error {
			for {
				done, f, err := tunedBatch(gctx, env, pub, sel, update)
				if err != nil {
					return fmt.Errorf("bench: seed-tuned: %w", err)
				}
				if done == 0 {
					return nil
				}
				mu.Lock()
				failed += f
				mu.Unlock()
				env.meter.done.Add(int64(done))
			}
		})
	}
	err = g.Wait()
	r := newRun(n, time.Since(start))
	r.setCPU(cpu.end(), benchRelays)
	untimed()
	if err != nil {
		return RunResult{}, err
	}
	r.Failed = failed
	if r.Left, err = env.leftSeed(ctx, env.tunedSchema); err != nil {
		return r, err
	}
	return env.finish(ctx, r)
}

func tunedBatch(ctx context.Context, env *Env, pub outbox.Publisher, sel string, update func(int) string) (int, int64, error) {
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, sel, SeedBatch)
	if err != nil {
		return 0, 0, err
	}
	var (
		ids  [][16]byte
		msgs []*outbox.Message
	)
	for rows.Next() {
		var (
			id      [16]byte
			typ     string
			content []byte
		)
		if err := rows.Scan(&id, &typ, &content); err != nil {
			rows.Close()
			return 0, 0, err
		}
		ids = append(ids, id)
		msgs = append(msgs, &outbox.Message{ID: uuid.Format(id), Topic: typ, Payload: content})
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	if len(msgs) == 0 {
		return 0, 0, nil
	}
	errs := pub.Publish(ctx, msgs)
	now := time.Now()
	args := make([]any, 0, 3*len(msgs))
	var failed int64
	for i := range msgs {
		var e *string
		perr := fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		if i < len(errs) {
			perr = errs[i]
		}
		if perr != nil {
			s := perr.Error()
			e = &s
			failed++
		}
		args = append(args, ids[i], now, e)
	}
	if _, err := tx.Exec(ctx, update(len(msgs)), args...); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	return len(msgs), failed, nil
}

// uuidV4 returns a random UUID (version 4), like .NET's Guid.NewGuid().
func uuidV4() [16]byte {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}
