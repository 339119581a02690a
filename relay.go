package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Relay drains an outbox ([Store] or [StreamStore]) to a [Publisher]: at
// least once, in commit order per key (with [OrderingKey]), with Workers
// batches in flight, and with retries, backoff and dead letters for
// messages that keep failing.
//
// Create it with [NewRelay], then Start and Stop it, or Run it. Its methods
// are safe for concurrent use.
type Relay struct {
	store Source
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
	pool    *goPool         // publishes and fetch rounds run on its goroutines
	wakes   []chan struct{} // one per worker
	// fetchAll[i] asks worker i to fetch all its partitions; dirty[p] asks
	// p's worker to fetch p, and dirtied[i] tells worker i that one of its
	// partitions' dirty flags may be set (set after them: a worker that
	// finds it clear has no dirty flag of its own to look at). Set by
	// notifications, cleared by the workers.
	fetchAll []atomic.Bool
	dirty    []atomic.Bool
	dirtied  []atomic.Bool
	// listening is set from the subscription's first notification (the
	// store's fn(nil) once subscribed) until it ends: polls are then a
	// safety net, made less often.
	listening atomic.Bool
	notified  atomic.Int32 // workers the last notification woke
	// Ordering none: the worker a notification wakes next, and which are
	// waiting for one.
	turn atomic.Uint64
	idle []atomic.Bool

	// reports: what workers tell the coordinator (drained hand-backs,
	// fenced leases); the leases themselves are the coordinator's alone.
	reports leaseReports

	partitions int
	// queueKey is the key a record is queued under, by Config.OrderScope.
	queueKey func(*Record) string
	dests    *destinations
	round    roundResult // of the last lease round; the coordinator's own
	// streamAsked: with a StreamStore, Hold was called since the last
	// Release (the store is trying to take, or holds, the stream for this
	// relay). The coordinator's own.
	streamAsked bool
	calls       *storeCalls  // the workers' fetches and settles, coalesced
	stopGap     *stopBarrier // key mode with a StreamStore: where a stop drains to
	caps        capabilities

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
	dupLog    atomic.Int64 // unix nanos of the last "duplicate" log line
}

// NewRelay returns a relay for store and pub. store is a [Store] (relays
// share its partitions by leases) or a [StreamStore] (the relay of the
// process holding the stream owns every partition). cfg is completed with
// [Config.WithDefaults] and validated; the error names the field to change.
// With OrderingNone the store must implement [UnorderedStore].
func NewRelay(store Source, pub Publisher, cfg Config) (*Relay, error) {
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
	caps := capsOf(store, pub)
	switch {
	case caps.leases == nil && caps.stream == nil:
		return nil, fmt.Errorf("outbox: NewRelay: the store %T is neither a Store (partition leases) nor a StreamStore (a stream held by one process): %w", store, ErrUnsupported)
	case caps.leases != nil && caps.stream != nil:
		return nil, fmt.Errorf("outbox: NewRelay: the store %T is both a Store and a StreamStore: a source has one way to own partitions", store)
	}
	if cfg.Ordering == OrderingNone && caps.unordered == nil {
		return nil, fmt.Errorf("outbox: Config.Ordering %q needs a store with row locks (UnorderedStore): %w", cfg.Ordering, ErrUnsupported)
	}
	caps.keyPipeline = keyPipelineOf(pub, cfg)
	r := &Relay{
		store:   store,
		pub:     pub,
		cfg:     cfg,
		log:     cfg.Logger.With("node", cfg.Node),
		done:    make(chan struct{}),
		reports: newLeaseReports(),

		queueKey: queueKeyOf(cfg.OrderScope),
	}
	if caps.notifier == nil {
		if _, ok := store.(interface {
			Subscribe(context.Context) (<-chan struct{}, error)
		}); ok {
			// The plain outbox.Notifier of earlier versions: no longer used.
			r.log.Warn("the store has Subscribe but not SubscribePartitions: the relay only polls (every Config.PollInterval); implement outbox.PartitionNotifier, passing nil when the partitions written are not known")
		}
	}
	r.dests = newDestinations(r.log, r.emit, cfg.PublishTimeout)
	r.caps = caps
	r.pool = newGoPool()
	r.calls = newStoreCalls(r)
	return r, nil
}

// Blocked returns the destinations the relay has paused because the broker
// refused them as a whole (no stream or topic, not authorised, unroutable,
// full, unreachable): their messages wait, spending no attempts, while
// other destinations are published.
func (r *Relay) Blocked() []BlockedDestination { return r.dests.list() }

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

// readySlack is what Ready allows beyond two heartbeat intervals: the time
// a lease round itself takes.
const readySlack = 250 * time.Millisecond

// Ready reports whether the relay is running and its last store round
// trip (heartbeat or claim) succeeded within two heartbeat intervals
// (plus readySlack).
func (r *Relay) Ready() bool {
	r.mu.Lock()
	running := r.state == 1
	r.mu.Unlock()
	last := r.lastBeat.Load()
	return running && last != 0 && time.Since(time.Unix(0, last)) < 2*r.cfg.HeartbeatInterval+readySlack
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
	defer r.pool.stop()
	var wg sync.WaitGroup
	r.wakes = make([]chan struct{}, r.cfg.Workers)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
	}
	r.fetchAll = make([]atomic.Bool, r.cfg.Workers)
	r.dirtied = make([]atomic.Bool, r.cfg.Workers)
	r.idle = make([]atomic.Bool, r.cfg.Workers)
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
			ws.Go(func() { r.runUnordered(workCtx, killCtx, i) })
		}
		ws.Wait()
		wg.Wait()
		return
	}

	r.stopGap = newStopBarrier(r.cfg.Workers)
	r.workers = make([]*worker, r.cfg.Workers)
	for i := range r.workers {
		r.workers[i] = newWorker(r, i, r.wakes[i])
	}
	coord := newCoordinator(r)
	coordDone := make(chan struct{})
	coordCtx, stopCoord := context.WithCancel(killCtx)
	go func() {
		defer close(coordDone)
		coord.run(coordCtx, workCtx, broadcast)
	}()
	var ws sync.WaitGroup
	for _, w := range r.workers {
		ws.Go(func() { w.run(workCtx, killCtx) })
	}
	ws.Wait()
	stopCoord()
	<-coordDone
	wg.Wait()
	coord.leave(killCtx) // the coordinator's state is the caller's now
}

// leave releases every lease and the node's heartbeat on shutdown (the
// stream, with a StreamStore), once the coordinator and the workers are
// done.
func (c *coordinator) leave(killCtx context.Context) {
	r := c.r
	ctx, cancel := context.WithTimeout(context.WithoutCancel(killCtx), r.cfg.PublishTimeout)
	defer cancel()
	if st := r.caps.stream; st != nil {
		if err := st.Release(ctx, r.cfg.Node); err != nil {
			r.log.Warn("releasing the stream failed", "err", err)
			r.fail(fmt.Errorf("outbox: release the stream: %w", err))
		}
	} else if err := r.caps.leases.Leave(ctx, r.cfg.Node, c.heldLeases()); err != nil {
		r.log.Warn("leave failed; leases expire by themselves", "err", err)
		r.fail(fmt.Errorf("outbox: leave: %w (the leases expire by themselves after Config.LeaseTTL)", err))
	}
	clear(c.leases) // the workers are done
	r.nLeases.Store(0)
	r.emit(Event{Kind: EventLeases})
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

// capabilities are the optional abilities of the store and publisher,
// decided once in NewRelay: no type assertion on a hot path.
type capabilities struct {
	// How the relay owns partitions: exactly one is set.
	leases Store       // partition leases shared with other relays
	stream StreamStore // a stream held by one process at a time; its settlements confirm a prefix

	late        lateMode          // how records committing below a cursor are found
	marked      MarkedFetcher     // with lateMarked: the store's fetch with marks
	notifier    PartitionNotifier // notifications (nil: none)
	cleaner     Cleaner           // retention cleanup (nil: none)
	unordered   UnorderedStore    // Ordering none (nil: unsupported)
	health      HealthChecker     // the publisher's broker health (nil: unknown)
	keyPipeline int               // messages of one key per Publish call (KeyPipeliner; 1: one)
}

// lateMode is the store's one answer to records that commit below a
// worker's cursor (a transaction that drew its sequence numbers before
// others but committed after them).
type lateMode uint8

const (
	lateSweep         lateMode = iota // workers sweep below their cursors every SweepInterval
	lateMarked                        // the fetch returns them (MarkedFetcher); a sweep every 30 s at most, as a safety net
	lateCommitOrdered                 // none can (CommitOrdered): no sweep
)

func capsOf(store Source, pub Publisher) capabilities {
	var c capabilities
	c.leases, _ = store.(Store)
	c.stream, _ = store.(StreamStore)
	if _, ok := store.(CommitOrdered); ok || c.stream != nil {
		c.late = lateCommitOrdered
	} else if mf, ok := store.(MarkedFetcher); ok {
		c.late, c.marked = lateMarked, mf
	}
	c.notifier, _ = store.(PartitionNotifier)
	c.cleaner, _ = store.(Cleaner)
	c.unordered, _ = store.(UnorderedStore)
	c.health, _ = pub.(HealthChecker)
	return c
}

// sweepEvery reports whether workers must sweep below their cursors, and how
// often at least: stores with marks only as a safety net.
func (c capabilities) sweepEvery(cfg Config) (every time.Duration, ok bool) {
	switch c.late {
	case lateCommitOrdered:
		return 0, false
	case lateMarked:
		return max(cfg.SweepInterval, markedSweepInterval), true
	default:
		return cfg.SweepInterval, true
	}
}
