package bench

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/dynamodb"
)

// Options.BrokerProcess and Options.SteadyConsumer values.
const (
	BrokerNATSServer = "nats-server"
	BrokerEmbedded   = "embedded"
	ConsumerDurable  = "durable"
	ConsumerOrdered  = "ordered"
)

// Defaults and limits of [Options].
const (
	MessagesDefault = 200_000
	MessagesMax     = 10_000_000
	// PayloadDefault is the payload size in bytes: small enough for the
	// article's covering index, which INCLUDEs the payload and so hits the
	// 2,712-byte index row limit.
	PayloadDefault = 200
	// PayloadMin is the smallest JSON payload generated: {"p":""}.
	PayloadMin       = 8
	KeysDefault      = 1000
	KeysMax          = 1_000_000
	RunsDefault      = 3
	RunsMax          = 100
	WorkersMax       = outbox.WorkersMax
	BatchSizeMax     = outbox.BatchSizeMax
	SeedNaiveWorkers = 1 // seed-naive: the article's single processor
	SeedTunedWorkers = 5 // seed-tuned: the article's 5 processors
	// SeedBatch is the seeds' batch size (the article's LIMIT 1000).
	SeedBatch = 1000
	// ScaleMessagesDefault is the backlog of the scaling scenarios, the
	// size of the ADR's runs.
	ScaleMessagesDefault  = 10_000
	SteadyDurationDefault = 10 * time.Second
	// IdleDurationDefault is how long the idle scenario measures.
	IdleDurationDefault = 20 * time.Second
	// SteadyWarmupDefault is the `outbox bench` default of
	// Options.SteadyWarmup.
	SteadyWarmupDefault = time.Second
	// SteadyRateDefault is steady/wal's rate when no rate is given: the
	// rate of steady/key@1000, so that the two compare.
	SteadyRateDefault = 1000
	// SteadyTxRateMax bounds the producers' transactions per second: above
	// it, transactions carry more than one message.
	SteadyTxRateMax = 1000
	// SteadyProducers is how many goroutines write in the steady scenario.
	SteadyProducers = 8
	// DynamoMessagesDefault is the backlog when the store is DynamoDB and
	// Messages is not set: dynalite, the usual local endpoint, relays a few
	// thousand messages a second at best, and real DynamoDB bills each
	// request.
	DynamoMessagesDefault = 10_000
	// OutstandingBacklogDefault is the backlog of the dynamodb/outstanding
	// scenario's second row (or Messages if smaller).
	OutstandingBacklogDefault = 10_000
	// OutstandingTopics and OutstandingShards are the ADR 0034 case the
	// dynamodb/outstanding scenario measures: 5 topics × 20 shards.
	OutstandingTopics = 5
	OutstandingShards = 20
)

// AMQP queue types of Options.AMQPQueueType.
const (
	AMQPClassic = "classic"
	AMQPQuorum  = "quorum"
)

// Options configures [Run]. The zero value of every field means its default.
type Options struct {
	// Store is a postgres:// URL of a database where the bench may create
	// (and at the end drops) its own schemas, or a dynamodb://TABLE?… URL:
	// the bench then creates tables named TABLE_bench_<random> (and
	// …_adr), drops them at the end, and runs only the DynamoDB scenarios.
	// Empty: a throwaway PostgreSQL server is started from the local
	// binaries for the run.
	Store string
	// Broker is a broker URL (nats://…; other schemes registered in
	// internal/backends, without the stream checks). Empty: an embedded
	// NATS server with JetStream file storage.
	Broker string
	// AMQPQueueType is the type of the queue the bench declares on an
	// amqp:// broker: AMQPClassic (the default) or AMQPQuorum.
	AMQPQueueType string
	// Layout is the layout of our outbox table (PostgreSQL, capture
	// table): "plain" (the default) or "ring" (see postgres.LayoutRing).
	Layout string

	// Messages is the backlog of the drain scenarios. Default
	// MessagesDefault, or DynamoMessagesDefault with a DynamoDB store.
	Messages int
	// Payload is the payload size in bytes (a JSON document, so that the
	// seeds' jsonb column takes it).
	Payload int
	// Keys is how many distinct keys the messages are spread over
	// (round-robin).
	Keys int
	// Batch and Workers configure our relay (default: the relay's defaults).
	Batch   int
	Workers int
	// Runs is how many times each drain scenario runs.
	Runs int
	// ScaleMessages is the backlog of the scaling scenarios (default
	// 10,000, or Messages if smaller).
	ScaleMessages int
	// Scenarios selects scenarios by name or path.Match pattern
	// ("relay/*", "seed-*"); empty selects all. See [ScenarioNames].
	Scenarios []string
	// SteadyRate is steady/wal's production rate in messages per second
	// (default SteadyRateDefault). The steady/ORDERING@RATE scenarios
	// carry their rates in their names.
	SteadyRate int
	// SteadyDuration is how long the steady scenario produces and measures.
	SteadyDuration time.Duration
	// SteadyWarmup is how long the steady scenario produces at the rate
	// before SteadyDuration starts: those messages are relayed and checked
	// but left out of the latency distribution, which so leaves out the
	// start-up (connections being opened, the first plans, the first
	// stream blocks). Zero means none.
	SteadyWarmup time.Duration
	// SteadyAloneDuration is how long the steady/ORDERING@RATE and
	// horizon scenarios measure the producers alone, the baseline that
	// the PostgreSQL CPU the relay adds is taken from (zero: as long as
	// SteadyDuration). A long hold of the horizon needs a long run with
	// the relay, not a long baseline.
	SteadyAloneDuration time.Duration
	// FastDB starts the throwaway PostgreSQL server with fsync=off (and
	// full_page_writes off), as the bench did before it measured durable
	// databases by default. Invalid with Store.
	FastDB bool
	// IdleDuration is how long the idle scenario measures a relay with
	// nothing to do.
	IdleDuration time.Duration
	// Executable is the outbox binary the bench runs its relay and broker
	// processes from (`outbox relay`, `outbox bench broker-process`);
	// default: its own (os.Executable). ChildEnv is added to their
	// environment.
	Executable string
	ChildEnv   []string

	// BrokerProcess is the broker process the bench starts when Broker
	// is empty: BrokerNATSServer (the default: the `nats-server` binary on
	// PATH, as a user runs it, with a configuration file of the bench's
	// own that sets only the address and the JetStream store directory)
	// or BrokerEmbedded (the bench's binary re-executed as `outbox bench
	// broker-process`: the nats-server module the outbox binary embeds).
	BrokerProcess string
	// SteadyConsumer is the JetStream consumer the steady/ORDERING@RATE
	// scenarios receive with: ConsumerDurable (the default: a durable
	// pull consumer with explicit acks, each message acknowledged) or
	// ConsumerOrdered (an ordered ephemeral consumer). A core
	// subscription on the stream's subjects measures, beside it, when the
	// broker routed each message.
	SteadyConsumer string
	// RelayProfile, if set, makes the steady/ORDERING@RATE scenarios run
	// their relay with --pprof and write its CPU profile over the
	// measured span to RelayProfile-SCENARIO.pprof (the scenario's name
	// with "/" and "@" made "-").
	RelayProfile string

	// OutstandingBacklog is the backlog of the dynamodb/outstanding
	// scenario's second row (default OutstandingBacklogDefault, or Messages
	// if smaller).
	OutstandingBacklog int

	// Logger receives the relay's and the bench's logs. Default: discard.
	Logger *slog.Logger
	// Notices receives one-line notices (such as "started a throwaway
	// PostgreSQL"). Default: discard.
	Notices io.Writer
	// Progress, if not nil, is called about 4 times a second while a
	// scenario runs, from a goroutine of its own.
	Progress func(Progress)
}

// Progress describes the scenario running now.
type Progress struct {
	Scenario string
	Round    int // 1-based
	Rounds   int
	Done     int64 // messages processed so far in this run
	Total    int64
	Phase    string // "writing", "running", "checking"
	Elapsed  time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if IsDynamoDB(o.Store) {
		o.Messages = cmp.Or(o.Messages, DynamoMessagesDefault)
	}
	o.Messages = cmp.Or(o.Messages, MessagesDefault)
	o.Payload = cmp.Or(o.Payload, PayloadDefault)
	o.Keys = cmp.Or(o.Keys, KeysDefault)
	o.Batch = cmp.Or(o.Batch, outbox.BatchSizeDefault)
	o.Workers = cmp.Or(o.Workers, outbox.WorkersDefault)
	o.Runs = cmp.Or(o.Runs, RunsDefault)
	o.ScaleMessages = cmp.Or(o.ScaleMessages, min(ScaleMessagesDefault, o.Messages))
	o.SteadyDuration = cmp.Or(o.SteadyDuration, SteadyDurationDefault)
	o.SteadyRate = cmp.Or(o.SteadyRate, SteadyRateDefault)
	o.IdleDuration = cmp.Or(o.IdleDuration, IdleDurationDefault)
	o.OutstandingBacklog = cmp.Or(o.OutstandingBacklog, min(OutstandingBacklogDefault, o.Messages))
	o.AMQPQueueType = cmp.Or(o.AMQPQueueType, AMQPClassic)
	o.BrokerProcess = cmp.Or(o.BrokerProcess, BrokerNATSServer)
	o.SteadyConsumer = cmp.Or(o.SteadyConsumer, ConsumerDurable)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Notices == nil {
		o.Notices = io.Discard
	}
	return o
}

// OptionError reports an invalid option. Flag is the `outbox bench` flag
// that sets it.
type OptionError struct {
	Field string
	Flag  string
	Msg   string
}

func (e *OptionError) Error() string { return "bench: " + e.Field + " " + e.Msg }

func invalid(field, flag, format string, args ...any) error {
	return &OptionError{Field: field, Flag: flag, Msg: fmt.Sprintf(format, args...)}
}

// Validate reports the first invalid field of o (after defaults).
func (o Options) Validate() error {
	ints := []struct {
		field, flag string
		v, lo, hi   int
	}{
		{"Messages", "messages", o.Messages, 1, MessagesMax},
		{"Payload", "payload", o.Payload, PayloadMin, outbox.MaxPayloadDefault},
		{"Keys", "keys", o.Keys, 1, KeysMax},
		{"Batch", "batch", o.Batch, 1, BatchSizeMax},
		{"Workers", "workers", o.Workers, 1, WorkersMax},
		{"Runs", "runs", o.Runs, 1, RunsMax},
		{"ScaleMessages", "messages", o.ScaleMessages, 1, MessagesMax},
		{"OutstandingBacklog", "messages", o.OutstandingBacklog, 1, MessagesMax},
	}
	for _, c := range ints {
		if c.v < c.lo || c.v > c.hi {
			return invalid(c.field, c.flag, "must be between %d and %d, got %d", c.lo, c.hi, c.v)
		}
	}
	if o.SteadyRate < 0 {
		return invalid("SteadyRate", "steady-rate", "must be a positive number of messages per second, got %d", o.SteadyRate)
	}
	if o.SteadyDuration <= 0 {
		return invalid("SteadyDuration", "steady-duration", "must be positive, got %v", o.SteadyDuration)
	}
	if o.FastDB && o.Store != "" {
		return invalid("FastDB", "fast-db", "applies to the throwaway PostgreSQL the bench starts; with --store the database runs as it is configured: drop --fast-db or --store")
	}
	if o.IdleDuration <= 0 {
		return invalid("IdleDuration", "idle-duration", "must be positive, got %v", o.IdleDuration)
	}
	if o.Layout != "" && o.Layout != LayoutPlain && o.Layout != LayoutRing {
		return invalid("Layout", "layout", "must be %q or %q, got %q", LayoutPlain, LayoutRing, o.Layout)
	}
	if o.SteadyAloneDuration < 0 {
		return invalid("SteadyAloneDuration", "steady-alone-duration", "must be 0 (as long as --steady-duration) or positive, got %v", o.SteadyAloneDuration)
	}
	if o.SteadyWarmup < 0 {
		return invalid("SteadyWarmup", "steady-warmup", "must be 0 (none) or positive, got %v", o.SteadyWarmup)
	}
	if o.BrokerProcess != BrokerNATSServer && o.BrokerProcess != BrokerEmbedded {
		return invalid("BrokerProcess", "broker-process", "must be %q or %q, got %q", BrokerNATSServer, BrokerEmbedded, o.BrokerProcess)
	}
	if o.SteadyConsumer != ConsumerDurable && o.SteadyConsumer != ConsumerOrdered {
		return invalid("SteadyConsumer", "steady-consumer", "must be %q or %q, got %q", ConsumerDurable, ConsumerOrdered, o.SteadyConsumer)
	}
	switch o.AMQPQueueType {
	case AMQPClassic:
	case AMQPQuorum:
		if s := scheme(o.Broker); s != "amqp" && s != "amqps" {
			broker := "the embedded NATS server"
			if s != "" {
				broker = "a " + s + ":// URL"
			}
			return invalid("AMQPQueueType", "amqp-queue-type", "%q applies to amqp:// and amqps:// brokers only; the broker is %s", o.AMQPQueueType, broker)
		}
	default:
		return invalid("AMQPQueueType", "amqp-queue-type", "must be %q or %q, got %q", AMQPClassic, AMQPQuorum, o.AMQPQueueType)
	}
	if IsDynamoDB(o.Store) {
		d, err := dynamodb.ParseURL(o.Store)
		if err != nil {
			return invalid("Store", "store", "%v", err)
		}
		if len(d.Table)+dynamoSuffixMax > 255 {
			return invalid("Store", "store", "table name %q is too long: the bench appends up to %d characters (_bench_<random>_adr) and DynamoDB allows 255; use a shorter name", d.Table, dynamoSuffixMax)
		}
	}
	if _, err := SelectFor(o.Store, o.Scenarios); err != nil {
		return err
	}
	return nil
}

// scheme returns the scheme of a URL ("" for an empty or scheme-less one).
func scheme(rawURL string) string {
	s, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return ""
	}
	return strings.ToLower(s)
}

// IsDynamoDB reports whether store is a dynamodb:// URL.
func IsDynamoDB(store string) bool { return scheme(store) == "dynamodb" }

// Scenario names.
const (
	SeedNaiveName     = "seed-naive"
	SeedTunedName     = "seed-tuned"
	RelayNoneName     = "relay/none"
	RelayKeyName      = "relay/key"
	CeilingStoreName  = "ceiling/store"
	CeilingBrokerName = "ceiling/broker"
	// CeilingName is the derived row 1 / (1/store + 1/broker).
	CeilingName = "ceiling/combined"
	// SteadyWALName is the steady scenario on the WAL capture: producers
	// emitting into the WAL while relay/wal runs.
	SteadyWALName = "steady/wal"

	// DynamoRelayKeyName is relay/key on a DynamoDB store, with the
	// requests and capacity units per message relayed.
	DynamoRelayKeyName = "dynamodb/relay-key"
	// DynamoOutstandingName is ADR 0034's case: finding the outstanding
	// messages of 5 topics × 20 shards the older way (a Query per topic and
	// shard) and ours (a parallel Scan), on an empty outbox and on a
	// backlog.
	DynamoOutstandingName = "dynamodb/outstanding"
)

// DynamoScenarioNames lists the scenarios that run on a DynamoDB store, in
// run order (dynamodb/outstanding runs once, after the rounds).
func DynamoScenarioNames() []string { return []string{DynamoRelayKeyName, DynamoOutstandingName} }

// ScalingWorkers are the worker counts of the scaling scenarios, and
// ADRRates the rates the ADR reports for them (events/s).
var (
	ScalingWorkers = []int{1, 2, 4, 8}
	ADRRates       = []float64{850, 1650, 3200, 5800}
)

// Published figures of the seeds (msg/s).
const (
	ArticleNaive = 1350
	// ArticleTuned is the article's final processor: 5 workers, SKIP
	// LOCKED, covering index, batched UPDATE, broker batch publish with
	// confirms (RabbitMQ).
	ArticleTuned = 32500
)

// RelaysCounts are the relay process counts of the relays/N scenarios.
var RelaysCounts = []int{1, 2, 3}

// RelaysName returns the name of the scenario with n relay processes
// draining one backlog.
func RelaysName(n int) string { return fmt.Sprintf("relays/%d", n) }

// ScalingName returns the name of the scaling scenario with w workers.
func ScalingName(w int) string { return fmt.Sprintf("scaling/w%d", w) }

// ScenarioNames lists every scenario in the order they run within a round
// (steady runs once, after the rounds).
func ScenarioNames() []string {
	names := []string{SeedNaiveName, SeedTunedName, RelayNoneName, RelayKeyName, RelayWALName, CeilingStoreName, CeilingWALName, CeilingBrokerName}
	for _, w := range ScalingWorkers {
		names = append(names, ScalingName(w))
	}
	for _, n := range RelaysCounts {
		names = append(names, RelaysName(n))
	}
	names = append(names, WALScenarioNames()[2:]...) // the writers
	names = append(names, LoadScenarioNames()...)
	return append(names, SteadyWALName, HorizonWALFreeName, HorizonWALHeldName)
}

// Select returns the PostgreSQL scenario names matched by patterns (names
// or path.Match patterns, comma-separated entries allowed), in run order.
// No patterns select everything. A pattern that matches nothing is an
// error.
func Select(patterns []string) ([]string, error) { return SelectFor("", patterns) }

// SelectFor is Select for the scenarios of store (a --store URL): with a
// dynamodb:// store only DynamoScenarioNames run, and a pattern that
// matches only PostgreSQL scenarios is an error naming --scenarios; with
// any other store a pattern matching only DynamoDB scenarios is.
func SelectFor(store string, patterns []string) ([]string, error) {
	all, other := ScenarioNames(), DynamoScenarioNames()
	kind, otherKind := "PostgreSQL", "DynamoDB"
	if IsDynamoDB(store) {
		all, other = other, all
		kind, otherKind = otherKind, kind
	}
	if IsMySQL(store) {
		all, other = MySQLScenarioNames(), ScenarioNames()
		kind, otherKind = "MySQL", "PostgreSQL"
	}
	var pats []string
	for _, p := range patterns {
		for _, q := range strings.Split(p, ",") {
			if q = strings.TrimSpace(q); q != "" {
				pats = append(pats, q)
			}
		}
	}
	if len(pats) == 0 {
		return all, nil
	}
	chosen := map[string]bool{}
	for _, p := range pats {
		if _, err := path.Match(p, ""); err != nil {
			return nil, invalid("Scenarios", "scenarios", "pattern %q is malformed: %v", p, err)
		}
		hit := false
		for _, n := range all {
			if ok, _ := path.Match(p, n); ok {
				chosen[n] = true
				hit = true
			}
		}
		if hit {
			continue
		}
		var wrong []string
		for _, n := range other {
			if ok, _ := path.Match(p, n); ok {
				wrong = append(wrong, n)
			}
		}
		if len(wrong) > 0 {
			return nil, invalid("Scenarios", "scenarios", "%q selects %s, which run(s) only on a %s store; with this %s store the scenarios are %s",
				p, strings.Join(wrong, ", "), otherKind, kind, strings.Join(all, ", "))
		}
		return nil, invalid("Scenarios", "scenarios", "%q matches no scenario; the scenarios are %s", p, strings.Join(all, ", "))
	}
	return slices.DeleteFunc(all, func(n string) bool { return !chosen[n] }), nil
}
