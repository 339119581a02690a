package outbox

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// Ordering selects how the relay orders publishing.
type Ordering string

const (
	// OrderingKey (the default) publishes messages of one key in commit
	// order, with any number of workers and relay processes, through
	// partition leases.
	OrderingKey Ordering = "key"
	// OrderingNone is the seeds' design: any worker claims any due records
	// with FOR UPDATE SKIP LOCKED, holding the transaction across the
	// broker call. No order.
	OrderingNone Ordering = "none"
)

// ParseOrdering parses "key" or "none".
func ParseOrdering(s string) (Ordering, error) {
	switch Ordering(s) {
	case OrderingKey, OrderingNone:
		return Ordering(s), nil
	}
	return "", fmt.Errorf("ordering must be %q or %q, got %q", OrderingKey, OrderingNone, s)
}

// OrderScope says which messages [OrderingKey] keeps in order.
type OrderScope string

const (
	// OrderScopeTopic (the default) keeps the order of the messages of one
	// key to one destination (topic): a key's messages to another topic go
	// on while one destination is blocked or one of its messages fails.
	// Consumers see a key's messages in order on each topic, which is all
	// a consumer of a topic (a Kafka topic, a JetStream subject, a
	// RabbitMQ routing key) can observe.
	OrderScopeTopic OrderScope = "topic"
	// OrderScopeKey keeps the order of a key's messages across every
	// topic: a key's message to one topic waits for its earlier message to
	// another. Choose it when one consumer reads several topics as one
	// ordered log (a JetStream stream over several subjects, a RabbitMQ
	// queue bound to several routing keys) and needs their order; then a
	// blocked destination or a failing message holds back the key's
	// messages to every topic.
	OrderScopeKey OrderScope = "key"
)

// ParseOrderScope parses "topic" or "key".
func ParseOrderScope(s string) (OrderScope, error) {
	switch OrderScope(s) {
	case OrderScopeTopic, OrderScopeKey:
		return OrderScope(s), nil
	}
	return "", fmt.Errorf("order scope must be %q (a key's messages per topic) or %q (a key's messages across topics), got %q", OrderScopeTopic, OrderScopeKey, s)
}

// PermanentPolicy says what the relay does with a message that failed
// permanently (the broker can never take it: too large, invalid).
type PermanentPolicy string

const (
	// PermanentDeadLetter (the default) dead-letters the message and goes
	// on with its key.
	PermanentDeadLetter PermanentPolicy = "dead-letter"
	// PermanentHoldKey keeps the message at the head of its key, retried
	// at BackoffMax, logging an error each time: for users who would
	// rather stop a key than deliver it with a gap.
	PermanentHoldKey PermanentPolicy = "hold"
)

// ParsePermanentPolicy parses "dead-letter" or "hold".
func ParsePermanentPolicy(s string) (PermanentPolicy, error) {
	switch PermanentPolicy(s) {
	case PermanentDeadLetter, PermanentHoldKey:
		return PermanentPolicy(s), nil
	}
	return "", fmt.Errorf("on-permanent must be %q or %q, got %q", PermanentDeadLetter, PermanentHoldKey, s)
}

// Defaults and limits of [Config].
const (
	WorkersDefault = 4
	WorkersMax     = 256

	BatchSizeDefault = 500
	BatchSizeMax     = 10000

	// FetchSizeDefault is how many records a worker reads per partition per
	// fetch, kept in memory until published.
	FetchSizeDefault = 1000
	FetchSizeMax     = 100000

	InFlightDefault = 2
	InFlightMax     = 64

	PublishTimeoutDefault = 10 * time.Second
	PublishTimeoutMin     = 10 * time.Millisecond

	LeaseTTLDefault = 30 * time.Second
	LeaseTTLMin     = 100 * time.Millisecond

	PollIntervalDefault = 500 * time.Millisecond
	PollIntervalMin     = time.Millisecond

	// StoreRetryMinDefault is the first wait after a failed store call.
	StoreRetryMinDefault = 25 * time.Millisecond
	StoreRetryMinMin     = time.Millisecond

	SweepIntervalDefault = time.Second

	// SettleIntervalDefault is how long acknowledged messages may wait to
	// be marked settled, so that one statement settles those of many
	// publishes (and of every worker). At 100 transactions a second a
	// settle every 100 ms instead of 20 wrote 4.3 × fewer settle
	// statements (each a commit, so a WAL flush) and cut the relay's CPU
	// per message by a tenth (issue #25); it delays no delivery, and a
	// crash republishes at most this much more. The default is a fifth of
	// PublishTimeout when that is less (SettleInterval must stay below it).
	SettleIntervalDefault = 100 * time.Millisecond

	MaxAttemptsDefault = 10
	MaxAttemptsMax     = 1000

	BackoffMinDefault = time.Second
	BackoffMaxDefault = 5 * time.Minute

	ShutdownTimeoutDefault = 30 * time.Second

	CleanupIntervalDefault = time.Minute
	CleanupBatchDefault    = 10000
)

// Config configures a [Relay]. The zero value of every field means its
// default; see the *Default constants.
type Config struct {
	// Node identifies this relay process in leases and status. Default:
	// hostname-pid-random.
	Node string
	// Ordering is OrderingKey (default) or OrderingNone.
	Ordering Ordering
	// OrderScope is what OrderingKey keeps in order: a key's messages per
	// topic (OrderScopeTopic, the default) or across topics
	// (OrderScopeKey).
	OrderScope OrderScope
	// Workers is how many batches are built and published concurrently.
	Workers int
	// BatchSize bounds the messages in one Publish call.
	BatchSize int
	// FetchSize bounds the records read per partition per fetch, and so the
	// records a worker holds in memory per partition.
	FetchSize int
	// InFlight bounds the Publish calls one worker has in flight. Eligible
	// records are split over the free calls, so keys come back from the
	// broker in small groups and go out again at once.
	InFlight int
	// PublishTimeout bounds one Publish call.
	PublishTimeout time.Duration
	// LeaseTTL is how long a partition lease lasts without renewal. It must
	// exceed 2 × PublishTimeout (by 10 ms at least): a relay starts a
	// publish only while its lease will outlive the publish, so it stops
	// publishing before the lease can expire.
	LeaseTTL time.Duration
	// HeartbeatInterval is how often leases are renewed and rebalanced.
	// After each renewal, publishes start for LeaseTTL - 2 × PublishTimeout,
	// so it must be below that (or publishing would pause every round).
	// Default: the smaller of LeaseTTL/3 and half that window (5 s with the
	// default LeaseTTL and PublishTimeout).
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle worker looks for new records when no
	// notification arrives. While the relay is subscribed to a store's
	// notifications (PostgreSQL's LISTEN), which announce every Write
	// within milliseconds, it polls four times less often: the poll then
	// only finds rows no notification announced. It means only that: the
	// wait after a failed store call is StoreRetryMin, and readiness is
	// judged on HeartbeatInterval.
	PollInterval time.Duration
	// StoreRetryMin is the first wait after a failed store call (a lease
	// round, a fetch, a settle, a claim, a subscription to notifications):
	// the wait doubles, with jitter, up to HeartbeatInterval, and a success
	// resets it. Default StoreRetryMinDefault.
	StoreRetryMin time.Duration
	// SettleInterval is how long a worker may hold the settlements of
	// acknowledged messages (and retries and dead letters) before writing
	// them, unless a batch's worth is waiting: the workers write at the
	// same instants (multiples of SettleInterval), so at a steady load one
	// statement settles what every worker published meanwhile instead of
	// one statement per publish. It does not delay delivery: a key's next
	// message goes out when the broker acknowledged the previous one. A
	// crash before the write publishes those messages again (at least
	// once), as it does for any message published but not yet settled.
	SettleInterval time.Duration
	// SweepInterval is how often a worker looks below its cursors for
	// records whose transaction committed late. With a store that
	// implements MarkedFetcher (PostgreSQL), fetches already return them
	// and the sweep runs at most every 30 s, as a safety net.
	SweepInterval time.Duration
	// MaxAttempts is how many failed publishes send a message to the dead
	// letters. Permanent errors dead-letter at once (see OnPermanent).
	// Failures of the destination ([BlockedError]) spend no attempt.
	MaxAttempts int
	// OnPermanent is what a permanent failure does: PermanentDeadLetter
	// (default) or PermanentHoldKey.
	OnPermanent PermanentPolicy
	// BackoffMin and BackoffMax bound the exponential backoff between
	// attempts; each delay is drawn with jitter between half and all of
	// min(BackoffMax, BackoffMin × 2^(attempts-1)).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// RetryPolicy, if set, replaces that schedule: it returns the delay
	// before a message's next attempt after attempts failed ones.
	RetryPolicy RetryPolicy
	// ShutdownTimeout bounds Stop: publishing in hand finishes and settles,
	// or is abandoned (the messages stay in the outbox) after this long.
	ShutdownTimeout time.Duration
	// CleanupInterval is how often a store that keeps published messages is
	// asked to delete expired ones.
	CleanupInterval time.Duration
	// Logger receives the relay's logs. Default: discard.
	Logger *slog.Logger
	// Hook receives events for metrics and tracing. It must not block.
	Hook Hook
	// Tracer, if set, traces every Publish call (see [PublishTracer]);
	// default none.
	Tracer PublishTracer
	// Now is the clock; default time.Now. Tests inject their own.
	Now func() time.Time
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Node == "" {
		host, _ := os.Hostname()
		c.Node = cmp.Or(host, "relay") + "-" + strconv.Itoa(os.Getpid()) + "-" + NewID()[24:32]
	}
	c.Ordering = cmp.Or(c.Ordering, OrderingKey)
	c.OrderScope = cmp.Or(c.OrderScope, OrderScopeTopic)
	c.OnPermanent = cmp.Or(c.OnPermanent, PermanentDeadLetter)
	c.Workers = cmp.Or(c.Workers, WorkersDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.FetchSize = cmp.Or(c.FetchSize, max(FetchSizeDefault, c.BatchSize))
	c.InFlight = cmp.Or(c.InFlight, InFlightDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, max(LeaseTTLDefault, 3*c.PublishTimeout))
	// Publishes start only while the lease outlives them: from a round's
	// start to LeaseTTL - 2 × PublishTimeout later. The next round must
	// come well within that window, or publishing stalls every round.
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, max(time.Millisecond, min(c.LeaseTTL/3, (c.LeaseTTL-2*c.PublishTimeout)/2)))
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.StoreRetryMin = cmp.Or(c.StoreRetryMin, StoreRetryMinDefault)
	c.SweepInterval = cmp.Or(c.SweepInterval, SweepIntervalDefault)
	c.SettleInterval = cmp.Or(c.SettleInterval, max(time.Millisecond, min(SettleIntervalDefault, c.PublishTimeout/5)))
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, max(BackoffMaxDefault, c.BackoffMin))
	if c.RetryPolicy == nil {
		c.RetryPolicy = ExponentialBackoff(c.BackoffMin, c.BackoffMax)
	}
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, CleanupIntervalDefault)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c (after defaults), naming
// the field and the accepted range.
func (c Config) Validate() error {
	if _, err := ParseOrdering(string(c.Ordering)); err != nil {
		return fmt.Errorf("outbox: Config.Ordering: %w", err)
	}
	if _, err := ParseOrderScope(string(c.OrderScope)); err != nil {
		return fmt.Errorf("outbox: Config.OrderScope: %w", err)
	}
	if _, err := ParsePermanentPolicy(string(c.OnPermanent)); err != nil {
		return fmt.Errorf("outbox: Config.OnPermanent: %w", err)
	}
	if err := between("Workers", c.Workers, 1, WorkersMax); err != nil {
		return err
	}
	if err := between("BatchSize", c.BatchSize, 1, BatchSizeMax); err != nil {
		return err
	}
	if err := between("FetchSize", c.FetchSize, c.BatchSize, FetchSizeMax); err != nil {
		return err
	}
	if err := between("InFlight", c.InFlight, 1, InFlightMax); err != nil {
		return err
	}
	if err := between("MaxAttempts", c.MaxAttempts, 1, MaxAttemptsMax); err != nil {
		return err
	}
	if c.PublishTimeout < PublishTimeoutMin {
		return fmt.Errorf("outbox: Config.PublishTimeout must be at least %v, got %v", PublishTimeoutMin, c.PublishTimeout)
	}
	if c.LeaseTTL < LeaseTTLMin || c.LeaseTTL < 2*c.PublishTimeout+publishWindowMin {
		return fmt.Errorf("outbox: Config.LeaseTTL must exceed 2 × PublishTimeout (%v) by at least %v and be at least %v, got %v", c.PublishTimeout, publishWindowMin, LeaseTTLMin, c.LeaseTTL)
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.LeaseTTL-2*c.PublishTimeout {
		return fmt.Errorf("outbox: Config.HeartbeatInterval must be positive and below LeaseTTL - 2 × PublishTimeout (%v): publishes start only in that window after each heartbeat; got %v", c.LeaseTTL-2*c.PublishTimeout, c.HeartbeatInterval)
	}
	if c.PollInterval < PollIntervalMin {
		return fmt.Errorf("outbox: Config.PollInterval must be at least %v, got %v", PollIntervalMin, c.PollInterval)
	}
	if c.StoreRetryMin < StoreRetryMinMin {
		return fmt.Errorf("outbox: Config.StoreRetryMin must be at least %v, got %v", StoreRetryMinMin, c.StoreRetryMin)
	}
	if c.SettleInterval <= 0 || c.SettleInterval >= c.PublishTimeout {
		return fmt.Errorf("outbox: Config.SettleInterval must be positive and below PublishTimeout (%v), got %v", c.PublishTimeout, c.SettleInterval)
	}
	if c.SweepInterval <= 0 {
		return fmt.Errorf("outbox: Config.SweepInterval must be positive, got %v", c.SweepInterval)
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		return fmt.Errorf("outbox: Config.BackoffMin must be positive and at most BackoffMax, got %v and %v", c.BackoffMin, c.BackoffMax)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("outbox: Config.ShutdownTimeout must be positive, got %v", c.ShutdownTimeout)
	}
	if c.CleanupInterval <= 0 {
		return fmt.Errorf("outbox: Config.CleanupInterval must be positive, got %v", c.CleanupInterval)
	}
	return nil
}

// publishWindowMin is the least time, after each lease renewal, during
// which publishes may start: LeaseTTL - 2 × PublishTimeout.
const publishWindowMin = 10 * time.Millisecond

func between(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("outbox: Config.%s must be between %d and %d, got %d", field, lo, hi, v)
	}
	return nil
}
