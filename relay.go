package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are a relay's running totals.
type Stats struct {
	Published    int64 // messages acknowledged by the broker
	Failed       int64 // failed attempts that will be retried
	DeadLettered int64 // messages moved to the dead letters
	Fenced       int64 // partitions lost to another relay while settling
	Leases       int   // partition leases held now
	// Blocked counts publishes refused for their destination (no attempt
	// spent); Duplicates, messages the broker acknowledged as duplicates;
	// Held, permanent failures that hold their key (PermanentHoldKey).
	Blocked    int64
	Duplicates int64
	Held       int64
	// BlockedDestinations is how many destinations are paused now.
	BlockedDestinations int
}

// Relay drains an outbox [Store] to a [Publisher]: at least once, in commit
// order per key (with [OrderingKey]), with Workers batches in flight, and
// with retries, backoff and dead letters for messages that keep failing.
//
// Create it with [NewRelay], then Start and Stop it, or Run it. Its methods
// are safe for concurrent use.
type Relay struct {
	store Store
	pub   Publisher
	cfg   Config
	log   *slog.Logger

	mu      sync.Mutex
	state   int                // 0 new, 1 started, 2 stopped
	cancel  context.CancelFunc // stops taking new work
	kill    context.CancelFunc // abandons work in hand
	done    chan struct{}
	runErr  error // what ended the relay, if anything went wrong; under mu
	workers []*worker
	wakes   []chan struct{} // one per worker
	// fetchAll[i] asks worker i to fetch all its partitions; dirty[p] asks
	// p's worker to fetch p. Set by notifications, cleared by the workers.
	fetchAll []atomic.Bool
	dirty    []atomic.Bool

	// Leases held, shared between the coordinator and the workers.
	leaseMu  sync.RWMutex
	leases   map[int]*heldLease
	leaseVer atomic.Uint64

	// Partitions being handed back (heldLease.shed) that their worker
	// reported drained, by partition: the epoch reported. drainedCh wakes
	// the coordinator to release them.
	drainMu   sync.Mutex
	drained   map[int]int64
	drainedCh chan struct{}

	partitions int
	dests      *destinations
	round      roundResult // of the last lease round; the coordinator's own
	calls      *storeCalls // the workers' fetches and settles, coalesced
	caps       capabilities

	lastBeat  atomic.Int64 // unix nanos of the last successful store round
	published atomic.Int64
	failed    atomic.Int64
	dead      atomic.Int64
	fenced    atomic.Int64
	nLeases   atomic.Int64
	blockedN  atomic.Int64
	dupN      atomic.Int64
	heldN     atomic.Int64
	failLog   atomic.Int64 // unix nanos of the last "failing" log line
}

// failLogEvery rate-limits the WARN line of retryable publish failures.
const failLogEvery = 10 * time.Second

type heldLease struct {
	Lease
	validUntil time.Time // local monotonic time after which no publish may start
	// shed: surplus being handed back to another relay. The lease is
	// renewed, but its worker starts nothing new for it; once nothing is in
	// flight or waiting to be settled, the coordinator releases it. (Released
	// at once, a publish in flight would be published again by the next
	// owner, and its settlement lost.)
	shed bool
}

// NewRelay returns a relay for store and pub. cfg is completed with
// [Config.WithDefaults] and validated; the error names the field to change.
// With OrderingNone the store must implement [UnorderedStore].
func NewRelay(store Store, pub Publisher, cfg Config) (*Relay, error) {
	if store == nil {
		return nil, errors.New("outbox: NewRelay needs a store")
	}
	if pub == nil {
		return nil, errors.New("outbox: NewRelay needs a publisher")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Ordering == OrderingNone {
		if _, ok := store.(UnorderedStore); !ok {
			return nil, fmt.Errorf("outbox: Config.Ordering %q needs a store with row locks (UnorderedStore): %w", cfg.Ordering, ErrUnsupported)
		}
	}
	r := &Relay{
		store:     store,
		pub:       pub,
		cfg:       cfg,
		log:       cfg.Logger.With("node", cfg.Node),
		leases:    map[int]*heldLease{},
		done:      make(chan struct{}),
		drained:   map[int]int64{},
		drainedCh: make(chan struct{}, 1),
	}
	r.dests = newDestinations(r.log, r.emit, cfg.PublishTimeout)
	r.caps = capsOf(store, pub)
	r.calls = newStoreCalls(r)
	return r, nil
}

// Blocked returns the destinations the relay has paused because the broker
// refused them as a whole (no stream or topic, not authorised, unroutable,
// full, unreachable): their messages wait, spending no attempts, while
// other destinations are published.
func (r *Relay) Blocked() []BlockedDestination { return r.dests.list() }

// observe updates the destinations' state with one publish result.
func (r *Relay) observe(rec *Record, err error, now time.Time) {
	switch {
	case err == errNotAttempted:
		r.dests.unprobe(rec.Topic)
	case err == nil:
		r.dests.reached(rec.Topic)
	default:
		if _, blocked := IsBlocked(err); blocked {
			r.blockedN.Add(1)
			r.dests.blocked(rec.Topic, err, now)
		} else {
			r.dests.reached(rec.Topic) // the broker answered for the message
		}
	}
}

// Config returns the relay's configuration with defaults filled in.
func (r *Relay) Config() Config { return r.cfg }

// Start starts the relay's goroutines and returns. The relay runs until Stop
// is called or ctx ends (which abandons work in hand like a timed-out Stop;
// prefer Stop for a graceful end).
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != 0 {
		return errors.New("outbox: relay already started or stopped: make a new one with NewRelay")
	}
	p, err := r.store.Partitions(ctx)
	if err != nil {
		return fmt.Errorf("outbox: relay start: %w", err)
	}
	if p < 1 {
		return fmt.Errorf("outbox: store reports %d partitions", p)
	}
	r.partitions = p
	r.state = 1
	killCtx, kill := context.WithCancel(context.WithoutCancel(ctx))
	workCtx, cancel := context.WithCancel(killCtx)
	r.kill, r.cancel = kill, cancel
	go func() { // ctx ending abandons everything
		select {
		case <-ctx.Done():
			kill()
		case <-killCtx.Done():
		}
	}()
	go r.run(workCtx, killCtx)
	return nil
}

// Stop stops taking new work, waits for the batches in hand to be
// published and settled, releases the relay's leases and returns. After
// Config.ShutdownTimeout it abandons what is left (those messages stay in
// the outbox and are published again later) and returns an error wrapping
// [ErrShutdownTimeout]; a failure to release the leases is returned too.
// Stop is idempotent: later calls return the same error.
func (r *Relay) Stop() error {
	r.mu.Lock()
	switch r.state {
	case 0:
		r.state = 2
		close(r.done) // never started: nothing to wait for
		r.mu.Unlock()
		return nil
	case 2:
		r.mu.Unlock()
		<-r.done
		return r.err()
	}
	r.state = 2
	cancel, kill := r.cancel, r.kill
	r.mu.Unlock()
	cancel()
	t := time.NewTimer(r.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		r.log.Warn("shutdown timeout: abandoning work in hand", "timeout", r.cfg.ShutdownTimeout)
		r.fail(fmt.Errorf("%w (Config.ShutdownTimeout %v): those messages stay in the outbox and are published again", ErrShutdownTimeout, r.cfg.ShutdownTimeout))
		kill()
		<-r.done
	}
	kill()
	return r.err()
}

// fail records an error that Stop returns (the first of each kind is kept,
// joined).
func (r *Relay) fail(err error) {
	r.mu.Lock()
	r.runErr = errors.Join(r.runErr, err)
	r.mu.Unlock()
}

func (r *Relay) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runErr
}

// Run starts the relay and stops it gracefully when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()
	return r.Stop()
}

// Done is closed when the relay has stopped.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Ready reports whether the relay is running and its last store round
// trip (heartbeat or claim) succeeded within two heartbeat intervals.
func (r *Relay) Ready() bool {
	r.mu.Lock()
	running := r.state == 1
	r.mu.Unlock()
	last := r.lastBeat.Load()
	return running && last != 0 && time.Since(time.Unix(0, last)) < 2*r.cfg.HeartbeatInterval+r.cfg.PollInterval
}

// Stats returns the relay's running totals.
func (r *Relay) Stats() Stats {
	return Stats{
		Published:    r.published.Load(),
		Failed:       r.failed.Load(),
		DeadLettered: r.dead.Load(),
		Fenced:       r.fenced.Load(),
		Leases:       int(r.nLeases.Load()),
		Blocked:      r.blockedN.Load(),
		Duplicates:   r.dupN.Load(),
		Held:         r.heldN.Load(),

		BlockedDestinations: int(r.dests.n.Load()),
	}
}

func (r *Relay) emit(e Event) {
	if r.cfg.Hook != nil {
		r.cfg.Hook(e)
	}
}

func (r *Relay) beat() { r.lastBeat.Store(time.Now().UnixNano()) }

// run is the relay's main goroutine: it starts the workers, the
// coordinator (key mode), the notifier and the cleaner, and waits for them.
func (r *Relay) run(workCtx, killCtx context.Context) {
	defer close(r.done)
	var wg sync.WaitGroup
	r.wakes = make([]chan struct{}, r.cfg.Workers)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
	}
	r.fetchAll = make([]atomic.Bool, r.cfg.Workers)
	r.dirty = make([]atomic.Bool, r.partitions)
	broadcast := func() {
		for i := range r.wakes {
			r.wake(i)
		}
	}
	r.dests.wake = broadcast
	wg.Go(func() { r.listen(workCtx) })
	if c := r.caps.cleaner; c != nil {
		wg.Go(func() { r.clean(workCtx, c) })
	}

	if r.cfg.Ordering == OrderingNone {
		var ws sync.WaitGroup
		for i := 0; i < r.cfg.Workers; i++ {
			ws.Go(func() { r.runUnordered(workCtx, killCtx, r.wakes[i]) })
		}
		ws.Wait()
		wg.Wait()
		return
	}

	r.workers = make([]*worker, r.cfg.Workers)
	for i := range r.workers {
		r.workers[i] = newWorker(r, i, r.wakes[i])
	}
	coordDone := make(chan struct{})
	coordCtx, stopCoord := context.WithCancel(killCtx)
	go func() {
		defer close(coordDone)
		r.coordinate(coordCtx, workCtx, broadcast)
	}()
	var ws sync.WaitGroup
	for _, w := range r.workers {
		ws.Go(func() { w.run(workCtx, killCtx) })
	}
	ws.Wait()
	stopCoord()
	<-coordDone
	wg.Wait()
	r.leave(killCtx)
}

// leave releases every lease and the node's heartbeat on shutdown.
func (r *Relay) leave(killCtx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(killCtx), r.cfg.PublishTimeout)
	defer cancel()
	if err := r.store.Leave(ctx, r.cfg.Node, r.heldLeases()); err != nil {
		r.log.Warn("leave failed; leases expire by themselves", "err", err)
		r.fail(fmt.Errorf("outbox: leave: %w (the leases expire by themselves after Config.LeaseTTL)", err))
	}
	r.leaseMu.Lock()
	clear(r.leases)
	r.leaseMu.Unlock()
	r.leaseVer.Add(1)
	r.nLeases.Store(0)
	r.emit(Event{Kind: EventLeases})
}

// wake nudges worker i, without blocking.
func (r *Relay) wake(i int) {
	select {
	case r.wakes[i] <- struct{}{}:
	default:
	}
}

// notifyAll makes every worker fetch all its partitions.
func (r *Relay) notifyAll() {
	for i := range r.wakes {
		r.fetchAll[i].Store(true)
		r.wake(i)
	}
}

// notifyPartitions makes the workers owning ps fetch those partitions.
func (r *Relay) notifyPartitions(ps []int) {
	for _, p := range ps {
		if p < 0 || p >= len(r.dirty) {
			continue
		}
		r.dirty[p].Store(true)
		r.wake(p % r.cfg.Workers)
	}
}

// listen forwards store notifications to the workers, resubscribing after
// failures (meanwhile the workers poll). A PartitionNotifier's
// notifications reach only the workers owning the partitions written.
func (r *Relay) listen(ctx context.Context) {
	pn, n := r.caps.partNotifier, r.caps.notifier
	byPartition, plain := pn != nil, n != nil
	if !byPartition && !plain {
		return
	}
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			// Writes committed while unsubscribed were not notified.
			r.notifyAll()
		}
		var err error
		if byPartition {
			err = pn.SubscribePartitions(ctx, func(ps []int) {
				if ps == nil {
					r.notifyAll()
				} else {
					r.notifyPartitions(ps)
				}
			})
		} else {
			var ch <-chan struct{}
			if ch, err = n.Subscribe(ctx); err == nil {
				for range ch {
					r.notifyAll()
				}
			}
		}
		if err != nil && ctx.Err() == nil {
			r.log.Debug("subscription failed; polling", "err", err)
		}
		if !sleepCtx(ctx, r.cfg.PollInterval) {
			return
		}
	}
}

func (r *Relay) clean(ctx context.Context, c Cleaner) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := c.Cleanup(ctx, CleanupBatchDefault)
			if err != nil {
				r.log.Warn("cleanup failed", "err", err)
				break
			}
			if n < CleanupBatchDefault {
				break
			}
		}
	}
}

// sleepCtx waits d or until ctx ends; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// coordinate heartbeats, renews and balances leases until ctx ends.
// workCtx ending means shutdown has begun: stop taking new leases.
func (r *Relay) coordinate(ctx, workCtx context.Context, broadcast func()) {
	failures := 0
	var cut cutOff
	var eager eagerRounds
	for {
		wait := r.cfg.HeartbeatInterval
		if cut.check(ctx, r) {
			wait = min(wait, r.cfg.LeaseTTL/4) // notice the way back soon
		}
		if err := r.leaseRound(ctx, workCtx.Err() != nil, cut.on); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("lease round failed", "err", err, "failures", failures)
			wait = min(wait, Backoff(failures, r.cfg.PollInterval, r.cfg.HeartbeatInterval))
		} else {
			failures = 0
			broadcast()
			if eager.next(r.round) {
				wait = min(wait, eagerRoundInterval)
			}
		}
		// Wait for the next round, releasing drained partitions meanwhile,
		// so that the relay taking them over need not wait a round.
		t := time.NewTimer(wait)
	sleep:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break sleep
			case <-r.drainedCh:
				r.releaseDrainedOrLog(ctx)
			}
		}
	}
}

// shedDrained records that the partition of l, being handed back, has
// nothing in flight or waiting to be settled, and wakes the coordinator.
// Workers call it; it is cheap and idempotent.
func (r *Relay) shedDrained(l Lease) {
	r.drainMu.Lock()
	e, ok := r.drained[l.Partition]
	r.drained[l.Partition] = l.Epoch
	r.drainMu.Unlock()
	if !ok || e != l.Epoch {
		select {
		case r.drainedCh <- struct{}{}:
		default:
		}
	}
}

// releaseDrained releases the leases being handed back whose worker
// reported them drained: they leave the relay's set first, so nothing new
// starts, then the store frees them for another relay.
func (r *Relay) releaseDrained(ctx context.Context) error {
	r.drainMu.Lock()
	drained := r.drained
	r.drained = map[int]int64{}
	r.drainMu.Unlock()
	if len(drained) == 0 {
		return nil
	}
	var release []Lease
	r.leaseMu.Lock()
	for p, epoch := range drained {
		if h, ok := r.leases[p]; ok && h.shed && h.Epoch == epoch {
			release = append(release, h.Lease)
			delete(r.leases, p)
		}
	}
	held := len(r.leases)
	r.nLeases.Store(int64(held))
	r.leaseMu.Unlock()
	if len(release) == 0 {
		return nil
	}
	r.leaseVer.Add(1)
	r.emit(Event{Kind: EventLeases, Count: held})
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.HeartbeatInterval, r.cfg.LeaseTTL/3))
	defer cancel()
	if err := r.store.ReleaseLeases(ctx, r.cfg.Node, release); err != nil {
		// They expire by themselves; meanwhile no other relay can take them.
		return fmt.Errorf("release leases: %w", err)
	}
	r.log.Info("handed back leases", "partitions", len(release))
	return nil
}

// leaseRound is one heartbeat: register, renew, shed or take leases.
// With cutOff (the broker unreachable for a lease TTL), the relay does not
// heartbeat, so other relays stop counting it, and hands every lease back.
func (r *Relay) leaseRound(ctx context.Context, shuttingDown, cutOff bool) error {
	ttl := r.cfg.LeaseTTL
	// A slow round only shortens the publishing window (validity counts
	// from its start), so it may take up to a third of the TTL.
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.HeartbeatInterval, ttl/3))
	defer cancel()
	start := time.Now()
	live, share := 0, 0
	if !cutOff {
		var err error
		if live, err = r.store.Heartbeat(ctx, r.cfg.Node, ttl); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		live = max(live, 1)
		share = (r.partitions + live - 1) / live
	}
	held := r.heldLeases()
	want := 0
	if !shuttingDown {
		want = max(0, share-len(held))
	}
	got, err := r.store.AcquireLeases(ctx, r.cfg.Node, held, want, ttl)
	if err != nil {
		return fmt.Errorf("acquire leases: %w", err)
	}
	r.round = roundResult{live: live, short: want > 0 && len(got) < len(held)+want}
	// The store set expiry to its now+ttl, no earlier than our start+ttl.
	// Stop starting publishes early enough that one in flight ends first.
	validUntil := start.Add(ttl - r.cfg.PublishTimeout)
	r.leaseMu.Lock()
	// Leases over the fair share are handed back in two steps: marked shed
	// now (renewed, nothing new starts), released once drained.
	var keep, shed []Lease
	for _, l := range got {
		if old, ok := r.leases[l.Partition]; ok && old.Epoch == l.Epoch && old.shed {
			shed = append(shed, l)
		} else {
			keep = append(keep, l)
		}
	}
	if shuttingDown && !cutOff {
		keep, shed = append(keep, shed...), nil // Leave releases them all
	} else if len(keep) > share {
		shed = append(shed, keep[share:]...)
		keep = keep[:share]
	} else if n := min(share-len(keep), len(shed)); n > 0 {
		keep = append(keep, shed[:n]...) // the share grew again: keep them
		shed = shed[n:]
	}
	next := make(map[int]*heldLease, len(got))
	changed := len(got) != len(r.leases)
	for i, l := range slices.Concat(keep, shed) {
		old, ok := r.leases[l.Partition]
		h := &heldLease{Lease: l, validUntil: validUntil, shed: i >= len(keep)}
		if !ok || old.Epoch != l.Epoch || old.shed != h.shed {
			changed = true
		}
		next[l.Partition] = h
	}
	r.leases = next
	r.leaseMu.Unlock()
	if changed {
		r.leaseVer.Add(1)
		r.log.Info("leases", "held", len(keep), "handing_back", len(shed), "live_relays", live, "share", share)
	}
	r.nLeases.Store(int64(len(got)))
	r.emit(Event{Kind: EventLeases, Count: len(got)})
	r.beat()
	r.releaseDrainedOrLog(ctx)
	return nil
}

// releaseDrainedOrLog releases the drained leases being handed back; a
// failure is logged (they have left the relay's set already and expire by
// themselves within LeaseTTL).
func (r *Relay) releaseDrainedOrLog(ctx context.Context) {
	if err := r.releaseDrained(ctx); err != nil && ctx.Err() == nil {
		r.emit(Event{Kind: EventStoreError, Err: err})
		r.log.Warn("releasing drained leases failed; they expire by themselves", "err", err, "lease_ttl", r.cfg.LeaseTTL)
	}
}

func (r *Relay) heldLeases() []Lease {
	r.leaseMu.RLock()
	defer r.leaseMu.RUnlock()
	out := make([]Lease, 0, len(r.leases))
	for _, l := range r.leases {
		out = append(out, l.Lease)
	}
	return out
}

// dropLease forgets a lease a settle found fenced.
func (r *Relay) dropLease(l Lease) {
	r.leaseMu.Lock()
	if h, ok := r.leases[l.Partition]; ok && h.Epoch == l.Epoch {
		delete(r.leases, l.Partition)
		r.nLeases.Store(int64(len(r.leases)))
	}
	r.leaseMu.Unlock()
	r.leaseVer.Add(1)
}

// Outcomes of one publish attempt.
const (
	outcomeDelivered = iota
	outcomeRetry
	outcomeDead
	outcomeBlocked // the destination refused: nothing to settle, no attempt
)

// outcome turns a publish result into the settlement entry for one record,
// updating the record for a retry, and returns which outcome it was.
func (r *Relay) outcome(rec *Record, err error, now time.Time, s *Settlement) int {
	if err == nil || errors.Is(err, ErrDuplicate) {
		if err != nil {
			r.dupN.Add(1)
			r.emit(Event{Kind: EventDuplicate, Topic: rec.Topic, Count: 1, Err: err})
			r.log.Warn("the broker acknowledged a duplicate (counted as delivered): a retry after a lost acknowledgement, or two messages sharing an ID", "id", rec.ID, "topic", rec.Topic, "err", err)
		}
		s.Delivered = append(s.Delivered, rec.ID)
		return outcomeDelivered
	}
	if _, blocked := IsBlocked(err); blocked {
		return outcomeBlocked
	}
	rec.Attempts++
	rec.LastError = err.Error()
	f := Failure{ID: rec.ID, Partition: rec.Partition, Attempts: rec.Attempts, Err: rec.LastError}
	if IsPermanent(err) && r.cfg.OnPermanent == PermanentHoldKey {
		// The user would rather stop the key than deliver it with a gap:
		// the message stays at the head of its key, retried at the
		// longest backoff, and says so every time.
		rec.NextAttemptAt = now.Add(r.cfg.BackoffMax)
		f.NextAttemptAt = rec.NextAttemptAt
		s.Retry = append(s.Retry, f)
		r.heldN.Add(1)
		r.emit(Event{Kind: EventHeld, Topic: rec.Topic, Count: 1, Err: err})
		r.log.Error("message failed permanently; its key is held (Config.OnPermanent = hold): fix it, or dead-letter it with `outbox dlq`", "id", rec.ID, "topic", rec.Topic, "key", rec.Key, "attempts", rec.Attempts, "retry_at", rec.NextAttemptAt, "err", err)
		return outcomeRetry
	}
	if IsPermanent(err) || rec.Attempts >= r.cfg.MaxAttempts {
		s.Dead = append(s.Dead, f)
		r.log.Warn("dead-lettering message", "id", rec.ID, "topic", rec.Topic, "attempts", rec.Attempts, "err", err)
		return outcomeDead
	}
	rec.NextAttemptAt = now.Add(Backoff(rec.Attempts, r.cfg.BackoffMin, r.cfg.BackoffMax))
	f.NextAttemptAt = rec.NextAttemptAt
	s.Retry = append(s.Retry, f)
	return outcomeRetry
}

// report counts one publish and emits its hook events.
func (r *Relay) report(recs []*Record, outcomes []int, errs []error, took time.Duration, now time.Time) {
	type counts struct{ n [4]int }
	byTopic := map[string]*counts{}
	var oldest time.Time
	var firstErr error
	for i, rec := range recs {
		c := byTopic[rec.Topic]
		if c == nil {
			c = &counts{}
			byTopic[rec.Topic] = c
		}
		c.n[outcomes[i]]++
		if outcomes[i] == outcomeDelivered {
			if oldest.IsZero() || rec.CreatedAt.Before(oldest) {
				oldest = rec.CreatedAt
			}
		} else if firstErr == nil {
			firstErr = errs[i]
		}
	}
	for topic, c := range byTopic {
		if n := c.n[outcomeDelivered]; n > 0 {
			r.published.Add(int64(n))
			r.emit(Event{Kind: EventPublished, Topic: topic, Count: n, Duration: took})
		}
		if n := c.n[outcomeRetry]; n > 0 {
			total := r.failed.Add(int64(n))
			r.emit(Event{Kind: EventFailed, Topic: topic, Count: n, Err: firstErr})
			last := r.failLog.Load()
			if t := time.Now().UnixNano(); t-last >= int64(failLogEvery) && r.failLog.CompareAndSwap(last, t) {
				r.log.Warn("publishes failing; retrying with backoff (logged at most every 10s)", "topic", topic, "failed", n, "failed_total", total, "err", firstErr)
			}
		}
		if n := c.n[outcomeDead]; n > 0 {
			r.dead.Add(int64(n))
			r.emit(Event{Kind: EventDeadLettered, Topic: topic, Count: n, Err: firstErr})
		}
	}
	if !oldest.IsZero() {
		r.emit(Event{Kind: EventLag, Duration: now.Sub(oldest)})
	}
}

// runUnordered is one worker of OrderingNone: claim with row locks,
// publish, settle and commit, again and again.
func (r *Relay) runUnordered(ctx, killCtx context.Context, wake <-chan struct{}) {
	us := r.caps.unordered
	failures, blockedRounds := 0, 0
	for ctx.Err() == nil {
		claim, err := us.ClaimUnordered(ctx, r.cfg.BatchSize)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("claim failed", "err", err)
			sleepCtx(ctx, Backoff(failures, r.cfg.PollInterval, r.cfg.HeartbeatInterval))
			continue
		}
		failures = 0
		r.beat()
		recs := claim.Records()
		if len(recs) == 0 {
			_ = claim.Release(killCtx)
			select {
			case <-ctx.Done():
			case <-wake:
			case <-time.After(r.cfg.PollInterval):
			}
			continue
		}
		msgs := make([]*Message, len(recs))
		ptrs := make([]*Record, len(recs))
		for i := range recs {
			msgs[i] = &recs[i].Message
			ptrs[i] = &recs[i]
		}
		pctx, cancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
		start := time.Now()
		errs := r.publish(pctx, ptrs, msgs)
		cancel()
		took := time.Since(start)
		now := r.cfg.Now()
		var s Settlement
		outcomes := make([]int, len(ptrs))
		nBlocked := 0
		for i, rec := range ptrs {
			r.observe(rec, errs[i], now)
			if outcomes[i] = r.outcome(rec, errs[i], now, &s); outcomes[i] == outcomeBlocked {
				nBlocked++ // left as it is: claimed again after a pause
			}
		}
		sctx, scancel := context.WithTimeout(killCtx, r.cfg.PublishTimeout)
		start = time.Now()
		err = claim.Settle(sctx, s)
		scancel()
		if err != nil {
			_ = claim.Release(killCtx)
			r.emit(Event{Kind: EventStoreError, Err: err})
			r.log.Warn("settle failed; the batch will be published again", "err", err)
			continue
		}
		r.emit(Event{Kind: EventSettled, Count: len(recs), Duration: time.Since(start)})
		r.report(ptrs, outcomes, errs, took, now)
		if nBlocked == len(recs) {
			// Every message's destination is blocked: pause like a probe
			// instead of claiming the same rows again at once.
			blockedRounds++
			sleepCtx(ctx, Backoff(blockedRounds, blockedProbeMin, blockedProbeMax))
		} else {
			blockedRounds = 0
		}
	}
}

// publish publishes msgs (those of recs) and returns one result per
// message. A record the store could not decode is not published: its
// result is a permanent error saying what was wrong, so it is
// dead-lettered alone while the others flow.
func (r *Relay) publish(ctx context.Context, recs []*Record, msgs []*Message) []error {
	bad := 0
	for _, rec := range recs {
		if rec.DecodeError != "" {
			bad++
		}
	}
	if bad == 0 {
		return r.send(ctx, recs, msgs)
	}
	errs := make([]error, len(msgs))
	good := make([]*Message, 0, len(msgs)-bad)
	goodRecs := make([]*Record, 0, len(msgs)-bad)
	idx := make([]int, 0, len(msgs)-bad)
	for i, rec := range recs {
		if rec.DecodeError != "" {
			errs[i] = Permanent(fmt.Errorf("outbox: the stored record cannot be decoded, so it is not published: %s", rec.DecodeError))
			continue
		}
		good = append(good, msgs[i])
		goodRecs = append(goodRecs, rec)
		idx = append(idx, i)
	}
	if len(good) > 0 {
		for j, err := range r.send(ctx, goodRecs, good) {
			errs[idx[j]] = err
		}
	}
	return errs
}

// fixErrs guards against publishers returning the wrong number of results:
// a missing result is a failure, never a success.
func fixErrs(errs []error, n int) []error {
	if len(errs) == n {
		return errs
	}
	out := make([]error, n)
	for i := range out {
		if i < len(errs) {
			out[i] = errs[i]
		} else {
			out[i] = fmt.Errorf("outbox: publisher returned %d results for %d messages", len(errs), n)
		}
	}
	return out
}

// cutOff tracks whether the relay has been unable to reach its broker for a
// lease TTL: it then hands its partitions back (and stops heartbeating, so
// that other relays take them at once) until the broker is reachable again.
// Only publishers that implement [HealthChecker] are judged: a blocked
// destination alone (a deleted stream) must not make every relay give up.
type cutOff struct {
	since time.Time // first failed check of the current outage, or zero
	on    bool
}

// check runs the health check and returns whether the relay is cut off.
func (c *cutOff) check(ctx context.Context, r *Relay) bool {
	hc := r.caps.health
	if hc == nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	err := hc.Health(hctx)
	cancel()
	now := time.Now()
	if err == nil {
		if c.on {
			r.log.Info("broker reachable again: taking partitions again", "cut_off_for", now.Sub(c.since).Round(time.Millisecond))
		}
		c.since, c.on = time.Time{}, false
		return false
	}
	if ctx.Err() != nil {
		return c.on
	}
	if c.since.IsZero() {
		c.since = now
		r.log.Warn("broker unreachable; partitions are handed back if it lasts a lease TTL", "err", err, "lease_ttl", r.cfg.LeaseTTL)
	}
	if !c.on && now.Sub(c.since) >= r.cfg.LeaseTTL {
		c.on = true
		r.log.Warn("cut off from the broker for a lease TTL: handing every partition back to relays that can publish", "err", err, "since", c.since)
		// Stop counting as a live relay now, not when the heartbeat expires.
		lctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		if err := r.store.Leave(lctx, r.cfg.Node, nil); err != nil {
			r.log.Warn("removing the heartbeat failed; it expires by itself", "err", err)
		}
		cancel()
	}
	return c.on
}

// eagerRoundInterval is how often a relay below its fair share tries to
// take partitions while they are being handed back to it.
const eagerRoundInterval = 200 * time.Millisecond

// roundResult is what the coordinator learns from a lease round.
type roundResult struct {
	live  int  // relays alive
	short bool // fewer partitions were free than the fair share wanted
}

// eagerRounds makes the lease rounds frequent for a while when the number
// of live relays changed and this relay is below its share: the relays
// above theirs hand partitions back as soon as their publishes in flight
// are settled, and the joining relay takes them within eagerRoundInterval
// instead of a heartbeat later. The budget (40 eager rounds, about 8 s,
// per change) keeps a relay that can never reach its share
// (64 partitions over 3 relays) from polling forever.
type eagerRounds struct {
	live   int
	budget int
}

// next reports whether the next round should come early.
func (e *eagerRounds) next(last roundResult) bool {
	if last.live != e.live {
		e.live = last.live
		e.budget = 40
	}
	if !last.short || e.budget <= 0 {
		return false
	}
	e.budget--
	return true
}

// capabilities are the optional abilities of the store and publisher,
// decided once in NewRelay: no type assertion on a hot path.
type capabilities struct {
	marked        MarkedFetcher     // late commits come with the fetch (nil: none)
	commitOrdered bool              // nothing commits below a cursor: no sweep
	cleaner       Cleaner           // retention cleanup (nil: none)
	partNotifier  PartitionNotifier // notifications name partitions (nil: none)
	notifier      Notifier          // plain notifications (nil: none)
	unordered     UnorderedStore    // Ordering none (nil: unsupported)
	health        HealthChecker     // the publisher's broker health (nil: unknown)
}

func capsOf(store Store, pub Publisher) capabilities {
	var c capabilities
	c.marked, _ = store.(MarkedFetcher)
	_, c.commitOrdered = store.(CommitOrdered)
	c.cleaner, _ = store.(Cleaner)
	c.partNotifier, _ = store.(PartitionNotifier)
	c.notifier, _ = store.(Notifier)
	c.unordered, _ = store.(UnorderedStore)
	c.health, _ = pub.(HealthChecker)
	return c
}

// sweepEvery reports whether workers must sweep below their cursors, and how
// often at least: stores with marks only as a safety net.
func (c capabilities) sweepEvery(cfg Config) (every time.Duration, ok bool) {
	switch {
	case c.commitOrdered:
		return 0, false
	case c.marked != nil:
		return max(cfg.SweepInterval, markedSweepInterval), true
	default:
		return cfg.SweepInterval, true
	}
}
