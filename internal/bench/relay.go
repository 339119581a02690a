package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxrelay/outbox"
)

// RelayNone drains a backlog of k.Messages with our relay in ordering
// none (SKIP LOCKED claims), k.Workers workers, batches of k.Batch.
func RelayNone(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	return relayDrain(ctx, env, k, outbox.OrderingNone)
}

// RelayKey drains a backlog of k.Messages with our relay in ordering key
// (partition leases, per-key order), k.Workers workers, batches of k.Batch.
func RelayKey(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
	return relayDrain(ctx, env, k, outbox.OrderingKey)
}

// relayDrain writes the backlog with the store's Writer, starts a relay on
// a fresh store and publisher, and times it from Start until the outbox
// is empty; then it stops the relay (untimed) and checks the stream.
func relayDrain(ctx context.Context, env *Env, k Knobs, ordering outbox.Ordering) (RunResult, error) {
	n := k.Messages
	if err := env.prepareOurs(ctx, k, n); err != nil {
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
	store, err := env.openStore()
	if err != nil {
		return RunResult{}, err
	}
	defer store.Close()
	var clock relayClock
	relay, err := outbox.NewRelay(store, pub, outbox.Config{
		Ordering:  ordering,
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
	err = pollUntil(ctx, "relay/"+string(ordering), func() (bool, int64, error) {
		st := relay.Stats()
		env.meter.done.Store(st.Published)
		if st.DeadLettered > 0 {
			return false, 0, fmt.Errorf("bench: the relay dead-lettered %d messages", st.DeadLettered)
		}
		if st.Published < int64(n) {
			return false, st.Published, nil
		}
		left, err := env.leftOurs(ctx)
		return left == 0, st.Published - left, err
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
	r.setCPU(cpuUsed)
	if r.Left, err = env.leftOurs(ctx); err != nil {
		return r, err
	}
	return env.finish(ctx, r)
}

// Scaling returns the scaling scenario with w workers: relay/key on the
// given backlog (the ADR's runs used 10,000 events).
func Scaling(w, messages int) ScenarioFunc {
	return func(ctx context.Context, env *Env, k Knobs) (RunResult, error) {
		k.Workers = w
		k.Messages = messages
		return RelayKey(ctx, env, k)
	}
}
