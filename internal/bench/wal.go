package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Scenarios of the WAL capture (store/postgres with CaptureWAL).
const (
	// RelayWALName drains the standard backlog, written into the WAL
	// with pg_logical_emit_message, with our relay reading a logical
	// replication slot: next to relay/key, which reads the table.
	RelayWALName = "relay/wal"
	// CeilingWALName is ceiling/store for the WAL: the backlog captured
	// from the slot and settled, no broker.
	CeilingWALName = "ceiling/wal"
	// The writer scenarios time writers alone (no relay): SteadyProducers
	// goroutines committing transactions of 1 or 10 messages into the
	// table (INSERT … FROM unnest, plus its NOTIFY) or into the WAL.
	WriterTableTx1Name  = "writer/table-tx1"
	WriterWALTx1Name    = "writer/wal-tx1"
	WriterTableTx10Name = "writer/table-tx10"
	WriterWALTx10Name   = "writer/wal-tx10"
	// WriterMessagesMax bounds the messages of a writer scenario run
	// (Messages if smaller).
	WriterMessagesMax = 50_000
)

// WALScenarioNames lists the WAL capture scenarios in run order.
func WALScenarioNames() []string {
	return []string{RelayWALName, CeilingWALName, WriterTableTx1Name, WriterWALTx1Name, WriterTableTx10Name, WriterWALTx10Name}
}

// walOptions are the WAL capture options of the bench: its own slot and
// publication (named like its schema), on its schema's tables.
func (e *Env) walOptions() postgres.Options {
	return postgres.Options{Schema: e.schema, Capture: postgres.CaptureWAL, WAL: postgres.WALOptions{Slot: e.schema, Publication: e.schema}}
}

// prepareWAL creates the bench's slot (and publication) and writes a
// backlog of k.Messages into the WAL, in transactions of writeChunk
// messages, then returns a WALStore on it. The slot is created before the
// backlog is written and dropped by cleanup, so that it keeps no WAL while
// the other scenarios run.
func (e *Env) prepareWAL(ctx context.Context, k Knobs) (store *postgres.WALStore, cleanup func(), err error) {
	n := k.Messages
	e.meter.start("writing", n)
	opts := e.walOptions()
	store, err = postgres.NewWAL(e.Pool, opts)
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() {
		store.Close()
		e.dropSlot(opts)
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if err := store.Migrate(ctx); err != nil {
		return nil, nil, fmt.Errorf("bench: capture wal needs a server that can stream logical changes: %w", err)
	}
	w := store.Writer()
	msgs := make([]outbox.Message, 0, writeChunk)
	for i := 0; i < n; i += writeChunk {
		msgs = msgs[:0]
		for j := i; j < min(n, i+writeChunk); j++ {
			msgs = append(msgs, e.message(k, j))
		}
		if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }); err != nil {
			return nil, nil, fmt.Errorf("bench: write the backlog into the WAL: %w", err)
		}
		e.meter.done.Add(int64(len(msgs)))
	}
	_, _ = e.Pool.Exec(ctx, `CHECKPOINT`)
	e.meter.setPhase("running")
	e.meter.done.Store(0)
	return store, cleanup, nil
}

// RelayWAL drains a backlog of k.Messages written into the WAL, with our
// relay (ordering key, k.Workers workers, batches of k.Batch) reading the
// slot, timed from Start until every message is published and settled
// (nothing held in memory).
func RelayWAL(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	store, cleanup, err := env.prepareWAL(ctx, k)
	if err != nil {
		return RunResult{}, err
	}
	defer cleanup()
	if err := env.Broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	pub, err := env.Broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	var clock relayClock
	relay, err := outbox.NewRelay(store, pub, outbox.Config{
		Workers:   k.Workers,
		BatchSize: k.Batch,
		Logger:    env.Log,
		Hook:      clock.hook,
	})
	if err != nil {
		return RunResult{}, err
	}
	cpu := newCPUMeter(ctx, env)
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	if err := relay.Start(tctx); err != nil {
		untimed()
		return RunResult{}, err
	}
	err = pollUntil(ctx, RelayWALName, func() (bool, int64, error) {
		st := relay.Stats()
		env.meter.done.Store(st.Published)
		if st.DeadLettered > 0 {
			return false, 0, fmt.Errorf("bench: the relay dead-lettered %d messages", st.DeadLettered)
		}
		return st.Published >= int64(n) && store.Stats().Buffered == 0, st.Published, nil
	})
	elapsed := time.Since(start)
	cpuUsed := cpu.end()
	untimed()
	stopErr := relay.Stop()
	if err != nil {
		return RunResult{}, err
	}
	if stopErr != nil {
		return RunResult{}, fmt.Errorf("bench: stop the relay: %w", stopErr)
	}
	r := newRun(n, elapsed)
	r.Failed = relay.Stats().Failed
	r.Relay = clock.times()
	r.Left = int64(store.Stats().Buffered)
	r.setCPU(cpuUsed, benchRelays)
	return env.finish(ctx, r)
}

// CeilingWAL is ceiling/store for the WAL capture: a backlog of
// k.Messages in the WAL is captured from the slot and settled with
// nothing but the store's work: k.Workers workers, each owning the
// partitions p with p % Workers == its index, alternate one Fetch of
// about k.Batch records and one Settle of them as delivered. No broker.
func CeilingWAL(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	n := k.Messages
	store, cleanup, err := env.prepareWAL(ctx, k)
	if err != nil {
		return RunResult{}, err
	}
	defer cleanup()
	const node = "ceiling"
	cpu := newCPUMeter(ctx, env).withoutBroker()
	tctx, untimed := timed(ctx)
	cpu.begin()
	start := time.Now()
	store.Start()
	if err := store.WaitStreaming(tctx); err != nil {
		untimed()
		return RunResult{}, err
	}
	epoch, _, err := store.Hold(tctx, node)
	if err == nil && epoch == 0 {
		err = errors.New("bench: the WAL ceiling's store streams but does not hold the stream")
	}
	if err != nil {
		untimed()
		return RunResult{}, err
	}
	defer store.Release(context.WithoutCancel(ctx), node)
	leases := make([]outbox.Lease, env.partitions)
	for p := range leases {
		leases[p] = outbox.Lease{Partition: p, Epoch: epoch}
	}
	var settled atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := range min(k.Workers, len(leases)) {
		var mine []outbox.Lease
		for i := w; i < len(leases); i += k.Workers {
			mine = append(mine, leases[i])
		}
		wg.Go(func() {
			cursors := make([]outbox.Cursor, len(mine))
			for i, l := range mine {
				cursors[i] = outbox.Cursor{Lease: l}
			}
			limit := max(1, (k.Batch+len(mine)-1)/len(mine))
			for settled.Load() < int64(n) && tctx.Err() == nil {
				recs, err := store.Fetch(tctx, cursors, limit)
				if err == nil && len(recs) > 0 {
					byPart := map[int]*outbox.Settlement{}
					for _, rec := range recs {
						st := byPart[rec.Partition]
						if st == nil {
							for _, l := range mine {
								if l.Partition == rec.Partition {
									st = &outbox.Settlement{Lease: l}
								}
							}
							byPart[rec.Partition] = st
						}
						st.Delivered = append(st.Delivered, rec.ID)
						for i := range cursors {
							if cursors[i].Partition == rec.Partition {
								cursors[i].After = max(cursors[i].After, rec.Seq)
							}
						}
					}
					var sts []outbox.Settlement
					for _, st := range byPart {
						sts = append(sts, *st)
					}
					err = store.Settle(tctx, node, sts)
					settled.Add(int64(len(recs)))
					env.meter.done.Store(settled.Load())
				} else if err == nil {
					time.Sleep(time.Millisecond) // the reader is behind: its pace, not a synchronisation
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpuUsed := cpu.end()
	untimed()
	if firstErr != nil {
		return RunResult{}, fmt.Errorf("bench: ceiling/wal: %w", firstErr)
	}
	r := newRun(n, elapsed)
	r.Left = int64(store.Stats().Buffered)
	r.setCPU(cpuUsed, benchRelays)
	return r, r.check()
}

// dropSlot drops the bench's slot and publication, if they exist.
func (e *Env) dropSlot(o postgres.Options) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, o.WAL.Slot); err != nil {
		e.Log.Warn("bench: drop the replication slot", "slot", o.WAL.Slot, "err", err)
	}
	if _, err := e.Pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{o.WAL.Publication}.Sanitize()); err != nil {
		e.Log.Warn("bench: drop the publication", "publication", o.WAL.Publication, "err", err)
	}
}

// Writer returns the writer scenario: SteadyProducers goroutines commit
// transactions of perTx messages, as fast as they can, into the table or
// the WAL, until min(k.Messages, WriterMessagesMax) are written. No relay
// runs.
func Writer(capture postgres.Capture, perTx int) ScenarioFunc {
	return func(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
		n := min(k.Messages, WriterMessagesMax)
		env.meter.start("writing", n)
		if _, err := env.Pool.Exec(ctx, `TRUNCATE `+env.messages); err != nil {
			return RunResult{}, fmt.Errorf("bench: empty the outbox: %w", err)
		}
		if err := env.settle(ctx, env.messages); err != nil {
			return RunResult{}, err
		}
		w := env.writer
		if capture == postgres.CaptureWAL {
			var err error
			if w, err = postgres.NewWriter(env.walOptions()); err != nil {
				return RunResult{}, err
			}
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		cpu := newCPUMeter(ctx, env).withoutBroker()
		tctx, untimed := timed(ctx)
		cpu.begin()
		start := time.Now()
		for range SteadyProducers {
			wg.Go(func() {
				msgs := make([]outbox.Message, perTx)
				for {
					i := int(next.Add(int64(perTx))) - perTx
					if i >= n || tctx.Err() != nil {
						return
					}
					m := msgs[:min(perTx, n-i)]
					for j := range m {
						m[j] = env.message(k, i+j)
					}
					if err := pgx.BeginFunc(tctx, env.Pool, func(tx pgx.Tx) error { return w.Write(tctx, tx, m...) }); err != nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
						return
					}
					env.meter.done.Add(int64(len(m)))
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		cpuUsed := cpu.end()
		untimed()
		if firstErr != nil {
			return RunResult{}, fmt.Errorf("bench: write: %w", firstErr)
		}
		r := newRun(n, elapsed)
		r.TxPerSec = float64((n+perTx-1)/perTx) / elapsed.Seconds()
		r.setCPU(cpuUsed, benchProduces)
		if _, err := env.Pool.Exec(ctx, `TRUNCATE `+env.messages); err != nil {
			return r, fmt.Errorf("bench: empty the outbox: %w", err)
		}
		return r, nil
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
