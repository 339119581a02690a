package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outbox"
)

// ceilingFetchSQL reads, per partition cursor, up to $3 pending records
// above the cursor with the columns the relay reads, in one statement (the
// shape of the store's Fetch, on the same pending index).
func ceilingFetchSQL(messages string) string {
	return `SELECT x.id, x.partition, x.seq, x.topic, x.key, x.payload, x.headers::text, x.created_at
FROM unnest($1::integer[], $2::bigint[]) AS c(p, after)
CROSS JOIN LATERAL (
    SELECT * FROM ` + messages + ` y
    WHERE y.partition = c.p AND y.seq > c.after AND y.published_at IS NULL
    ORDER BY y.seq
    LIMIT $3
) x`
}

// CeilingStore drains a backlog of k.Messages with nothing but the store's
// work: k.Workers workers, each owning the partitions p with p % Workers
// == its index, alternate one SELECT of about k.Batch records (per-partition
// cursors, as the relay reads) and one DELETE of those IDs. No broker, no
// leases, no fencing: an upper bound of what the store allows.
func CeilingStore(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	if err := env.prepareOurs(ctx, k, n); err != nil {
		return RunResult{}, err
	}
	fetch := ceilingFetchSQL(env.messages)
	del := `DELETE FROM ` + env.messages + ` WHERE id = ANY($1::uuid[])`
	cpu := newCPUMeter(ctx, env).withoutBroker()
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	g, gctx := errgroup.WithContext(tctx)
	for w := range min(k.Workers, env.partitions) {
		var parts []int32
		for p := w; p < env.partitions; p += k.Workers {
			parts = append(parts, int32(p))
		}
		g.Go(func() error { return ceilingStoreWorker(gctx, env, parts, k.Batch, fetch, del) })
	}
	err := g.Wait()
	r := newRun(n, time.Since(start))
	r.setCPU(cpu.end(), benchRelays)
	untimed()
	if err != nil {
		return RunResult{}, fmt.Errorf("bench: ceiling/store: %w", err)
	}
	if r.Left, err = env.leftOurs(ctx); err != nil {
		return r, err
	}
	return r, r.check()
}

func ceilingStoreWorker(ctx context.Context, env *Env, parts []int32, batch int, fetch, del string) error {
	after := make(map[int32]int64, len(parts))
	for len(parts) > 0 {
		limit := max(1, (batch+len(parts)-1)/len(parts))
		afters := make([]int64, len(parts))
		for i, p := range parts {
			afters[i] = after[p]
		}
		rows, err := env.Pool.Query(ctx, fetch, parts, afters, limit)
		if err != nil {
			return err
		}
		var ids [][16]byte
		got := map[int32]int{}
		for rows.Next() {
			var (
				rec     outbox.Record
				id      [16]byte
				part    int32
				headers *string
			)
			if err := rows.Scan(&id, &part, &rec.Seq, &rec.Topic, &rec.Key, &rec.Payload, &headers, &rec.CreatedAt); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
			got[part]++
			after[part] = max(after[part], rec.Seq)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) > 0 {
			if _, err := env.Pool.Exec(ctx, del, ids); err != nil {
				return err
			}
			env.meter.done.Add(int64(len(ids)))
		}
		// The backlog is fixed: a partition that returned less than asked
		// is drained.
		kept := parts[:0]
		for _, p := range parts {
			if got[p] == limit {
				kept = append(kept, p)
			}
		}
		parts = kept
	}
	return nil
}

// CeilingBroker publishes k.Messages messages (the backlog's topic, keys
// and payloads, fresh IDs) with confirmations and nothing else: batches of
// k.Batch, 2 × k.Workers Publish calls in flight (each relay worker keeps
// up to 2). No store.
func CeilingBroker(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	env.meter.start("writing", n)
	msgs := make([]*outbox.Message, n)
	now := time.Now()
	for i := range msgs {
		m := env.message(k, i)
		m.ID = outbox.NewID()
		m.CreatedAt = now
		msgs[i] = &m
	}
	if err := env.Broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	pub, err := env.Broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	env.meter.setPhase("running")
	env.meter.done.Store(0)

	var next atomic.Int64
	cpu := newCPUMeter(ctx, env)
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	g, gctx := errgroup.WithContext(tctx)
	for range 2 * k.Workers {
		g.Go(func() error {
			for {
				i := int(next.Add(int64(k.Batch))) - k.Batch
				if i >= n {
					return nil
				}
				batch := msgs[i:min(n, i+k.Batch)]
				errs := pub.Publish(gctx, batch)
				for j, err := range errs {
					if err != nil {
						return fmt.Errorf("bench: ceiling/broker: message %s: %w", batch[j].ID, err)
					}
				}
				if len(errs) != len(batch) {
					return fmt.Errorf("bench: ceiling/broker: publisher returned %d results for %d messages", len(errs), len(batch))
				}
				env.meter.done.Add(int64(len(batch)))
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
	return env.finish(ctx, r)
}
