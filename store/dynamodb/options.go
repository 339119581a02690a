package dynamodb

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxrelay/outbox"
)

// Defaults and limits of [Options].
const (
	// ShardsDefault is the shard count, which is also the relay's partition
	// count P. It is the ADR's example (20) rather than the relay's
	// [outbox.DefaultPartitions] (64): DynamoDB bills every request, and an
	// idle relay polls each shard, so fewer shards mean a cheaper idle
	// outbox, while 20 shards still spread writes over many index
	// partitions and give the relay 20 units of parallelism.
	ShardsDefault = 20
	// ShardsMax is the most shards accepted.
	ShardsMax = outbox.MaxPartitions

	// ScanConcurrencyDefault is how many segments a parallel Scan of an
	// all-topics index uses (the ADR's ScanConcurrency).
	ScanConcurrencyDefault = 4
	// ScanConcurrencyMax bounds ScanConcurrency.
	ScanConcurrencyMax = 64

	// PageSizeDefault is how many entries Outstanding and Dispatched return
	// when the query gives no Limit.
	PageSizeDefault = 100
	// PageSizeMax bounds PageSize and Query.Limit.
	PageSizeMax = 10000

	// CountPageSizeDefault is the Scan page size of OutstandingCount when no
	// MaxOutstanding is configured (the ADR's "default value").
	CountPageSizeDefault = 1000

	// ConcurrencyDefault bounds the requests one call of the store runs at
	// once (per-shard queries, batch chunks, per-item updates).
	ConcurrencyDefault = 16
	// ConcurrencyMax bounds Concurrency.
	ConcurrencyMax = 256

	// UnprocessedAttemptsDefault is how many times a batch call is sent in
	// all while DynamoDB returns unprocessed keys or items.
	UnprocessedAttemptsDefault = 8
	// UnprocessedBackoffDefault is the first delay before a batch call is
	// sent again with its unprocessed part; it doubles each time (with
	// jitter) up to UnprocessedBackoffMax.
	UnprocessedBackoffDefault = 20 * time.Millisecond
	// UnprocessedBackoffMax caps that delay.
	UnprocessedBackoffMax = 2 * time.Second

	// MaxPayloadDefault is the default payload limit. A DynamoDB item holds
	// at most 400 KB, attribute names and every other attribute included;
	// Write also checks the whole item's size.
	MaxPayloadDefault = 300 << 10
	// MaxItemSize is DynamoDB's item size limit.
	MaxItemSize = 400 << 10

	// FetchDelayDefault is how old (by its Seq) a message must be before
	// the relay's Fetch returns it. See Options.FetchDelay.
	FetchDelayDefault = time.Second
	// FetchDelayNone disables the fetch delay (Options.FetchDelay).
	FetchDelayNone time.Duration = -1

	// RegionDefault is used with a custom Endpoint (dynalite, DynamoDB
	// Local) when no region is configured.
	RegionDefault = "us-east-1"
)

// IndexNames names the global secondary indexes. The zero value of a field
// means its default, the Index* constants. Renaming lets a table created by
// infrastructure as code, or an older layout, keep its own names (see the
// migration guide in README.md).
type IndexNames struct {
	// Outstanding: hash TopicShard, range OutstandingCreatedTime (sparse).
	Outstanding string
	// Delivered: hash TopicShard, range DeliveryTime (sparse, sharded).
	Delivered string
	// OutstandingAllTopics: hash OutstandingCreatedTime, range MessageId.
	OutstandingAllTopics string
	// DeliveredAllTopics: hash DeliveryTime, range MessageId.
	DeliveredAllTopics string
	// Shard: hash Shard, range OutstandingSeq; the relay's index.
	Shard string
	// DeadLettered: hash DeadLetteredTime, range MessageId.
	DeadLettered string
}

// Default index names.
const (
	IndexOutstanding          = "Outstanding"
	IndexDelivered            = "Delivered"
	IndexOutstandingAllTopics = "OutstandingAllTopics"
	IndexDeliveredAllTopics   = "DeliveredAllTopics"
	IndexShard                = "OutstandingShard"
	IndexDeadLettered         = "DeadLettered"
)

func (n IndexNames) withDefaults() IndexNames {
	n.Outstanding = cmp.Or(n.Outstanding, IndexOutstanding)
	n.Delivered = cmp.Or(n.Delivered, IndexDelivered)
	n.OutstandingAllTopics = cmp.Or(n.OutstandingAllTopics, IndexOutstandingAllTopics)
	n.DeliveredAllTopics = cmp.Or(n.DeliveredAllTopics, IndexDeliveredAllTopics)
	n.Shard = cmp.Or(n.Shard, IndexShard)
	n.DeadLettered = cmp.Or(n.DeadLettered, IndexDeadLettered)
	return n
}

// Options configures a [Store]. The zero value of every field but Table
// means its default.
type Options struct {
	// Table is the DynamoDB table holding the outbox. Required: 3 to 255
	// characters of [A-Za-z0-9_.-].
	Table string
	// Shards is the shard count (and the relay's partition count): a
	// message goes to shard outbox.PartitionOf(Key, Shards). Fixed when the
	// table is migrated; every writer and relay must use the same value.
	// Default ShardsDefault.
	Shards int
	// ScanConcurrency is the number of segments of parallel Scans.
	// Default ScanConcurrencyDefault.
	ScanConcurrency int
	// PageSize is the default Limit of Outstanding and Dispatched.
	// Default PageSizeDefault.
	PageSize int
	// MaxOutstanding, when positive, is the backlog above which the outbox
	// counts as full: OutstandingCount then scans with a page size of
	// MaxOutstanding+1 and stops as soon as it has counted more than
	// MaxOutstanding. Zero: OutstandingCount counts everything with pages
	// of CountPageSizeDefault.
	MaxOutstanding int
	// Retention, when positive, keeps delivered messages: the relay marks
	// them dispatched (DeliveryTime set, listed by Dispatched) with an
	// ExpiresAt attribute (Unix seconds) now+Retention for DynamoDB's TTL
	// to delete them. Zero (the default): the relay deletes delivered
	// messages with BatchWriteItem.
	Retention time.Duration
	// FetchDelay holds back, from the relay's Fetch, messages written less
	// than FetchDelay ago (by their Seq and the store's clock). Global
	// secondary indexes are updated asynchronously and not in write order:
	// without a delay, a relay could see a key's second message before its
	// first and publish them out of order. With a delay longer than the
	// index lag, every message written before a fetched one is visible to
	// that fetch. It adds that much latency. Default FetchDelayDefault
	// (DynamoDB's index lag is normally well under a second);
	// FetchDelayNone disables it (for dynalite, whose indexes are
	// synchronous, or when order does not matter).
	FetchDelay time.Duration
	// Indexes names the global secondary indexes.
	Indexes IndexNames
	// MaxPayload bounds Message.Payload in bytes. Default MaxPayloadDefault;
	// at most MaxItemSize.
	MaxPayload int
	// Inject, if set, adds to each message what the ctx of Write (or
	// TransactWriteItemContext) carries
	// for consumers, before the message is validated: the trace context of
	// the writing span, with outboxtrace.Injector (package tracing/otel).
	// Default none: nothing is added.
	Inject outbox.HeaderInjector
	// Concurrency bounds the requests one call runs at once. Default
	// ConcurrencyDefault.
	Concurrency int
	// UnprocessedAttempts bounds the sends of one batch request while
	// DynamoDB returns unprocessed keys or items. Default
	// UnprocessedAttemptsDefault.
	UnprocessedAttempts int
	// UnprocessedBackoff is the first delay before resending unprocessed
	// keys or items. Default UnprocessedBackoffDefault.
	UnprocessedBackoff time.Duration

	// Endpoint, if set, is the DynamoDB endpoint URL, such as dynalite's or
	// DynamoDB Local's http://127.0.0.1:8000. With an endpoint and no
	// AWS_ACCESS_KEY_ID in the environment, static placeholder credentials
	// are used.
	Endpoint string
	// Region is the AWS region. Default: the SDK's configuration
	// (AWS_REGION, shared config), or RegionDefault with an Endpoint.
	Region string
	// Client, if set, is used instead of a client built from Endpoint,
	// Region and HTTPClient. Requests are still counted (see Stats).
	Client *dynamodb.Client
	// HTTPClient, if set, sends the requests of the client the store builds.
	// Default: a client of its own whose idle connections Close closes.
	HTTPClient aws.HTTPClient

	// Logger receives the store's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock; default time.Now. It stamps created, delivery and
	// dead-letter times, sequence numbers, and lease and heartbeat expiry.
	Now func() time.Time
	// OnRequest, if set, is called after every DynamoDB request with its
	// operation, consumed capacity and error: a hook for metrics. It is
	// called concurrently from the goroutines making requests and must not
	// block.
	OnRequest func(RequestEvent)
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.Shards = cmp.Or(o.Shards, ShardsDefault)
	o.ScanConcurrency = cmp.Or(o.ScanConcurrency, ScanConcurrencyDefault)
	o.PageSize = cmp.Or(o.PageSize, PageSizeDefault)
	o.Indexes = o.Indexes.withDefaults()
	o.FetchDelay = cmp.Or(o.FetchDelay, FetchDelayDefault)
	o.MaxPayload = cmp.Or(o.MaxPayload, MaxPayloadDefault)
	o.Concurrency = cmp.Or(o.Concurrency, ConcurrencyDefault)
	o.UnprocessedAttempts = cmp.Or(o.UnprocessedAttempts, UnprocessedAttemptsDefault)
	o.UnprocessedBackoff = cmp.Or(o.UnprocessedBackoff, UnprocessedBackoffDefault)
	if o.Endpoint != "" {
		o.Region = cmp.Or(o.Region, RegionDefault)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports the first invalid field of o (after defaults), naming
// the field and what to change.
func (o Options) Validate() error {
	if err := validateName("Table", o.Table); err != nil {
		return err
	}
	if err := between("Shards", o.Shards, 1, ShardsMax); err != nil {
		return err
	}
	if err := between("ScanConcurrency", o.ScanConcurrency, 1, ScanConcurrencyMax); err != nil {
		return err
	}
	if err := between("PageSize", o.PageSize, 1, PageSizeMax); err != nil {
		return err
	}
	if o.MaxOutstanding < 0 {
		return fmt.Errorf("dynamodb: Options.MaxOutstanding must be 0 (no maximum) or positive, got %d", o.MaxOutstanding)
	}
	if o.FetchDelay < 0 && o.FetchDelay != FetchDelayNone {
		return fmt.Errorf("dynamodb: Options.FetchDelay must be positive, or FetchDelayNone (-1) to disable it, got %v", o.FetchDelay)
	}
	if o.Retention < 0 {
		return fmt.Errorf("dynamodb: Options.Retention must be 0 (delete delivered messages) or positive, got %v", o.Retention)
	}
	for _, ix := range []struct{ field, name string }{
		{"Indexes.Outstanding", o.Indexes.Outstanding},
		{"Indexes.Delivered", o.Indexes.Delivered},
		{"Indexes.OutstandingAllTopics", o.Indexes.OutstandingAllTopics},
		{"Indexes.DeliveredAllTopics", o.Indexes.DeliveredAllTopics},
		{"Indexes.Shard", o.Indexes.Shard},
		{"Indexes.DeadLettered", o.Indexes.DeadLettered},
	} {
		if err := validateName(ix.field, ix.name); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, n := range []string{o.Indexes.Outstanding, o.Indexes.Delivered, o.Indexes.OutstandingAllTopics, o.Indexes.DeliveredAllTopics, o.Indexes.Shard, o.Indexes.DeadLettered} {
		if seen[n] {
			return fmt.Errorf("dynamodb: Options.Indexes: name %q is used twice; every index needs its own name", n)
		}
		seen[n] = true
	}
	if err := between("MaxPayload", o.MaxPayload, 1, MaxItemSize); err != nil {
		return err
	}
	if err := between("Concurrency", o.Concurrency, 1, ConcurrencyMax); err != nil {
		return err
	}
	if err := between("UnprocessedAttempts", o.UnprocessedAttempts, 1, 100); err != nil {
		return err
	}
	if o.UnprocessedBackoff <= 0 {
		return fmt.Errorf("dynamodb: Options.UnprocessedBackoff must be positive, got %v", o.UnprocessedBackoff)
	}
	if o.Endpoint != "" {
		u, err := url.Parse(o.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("dynamodb: Options.Endpoint must be an http or https URL such as http://127.0.0.1:8000, got %q", o.Endpoint)
		}
	}
	return nil
}

func between(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("dynamodb: Options.%s must be between %d and %d, got %d", field, lo, hi, v)
	}
	return nil
}

// validateName checks a table or index name against DynamoDB's rules.
func validateName(field, name string) error {
	if len(name) < 3 || len(name) > 255 {
		return fmt.Errorf("dynamodb: Options.%s must be 3 to 255 characters, got %q", field, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("dynamodb: Options.%s %q has %q at byte %d: use only letters, digits, '_', '-' and '.'", field, name, c, i)
		}
	}
	return nil
}

// URL query parameters of ParseURL, and the Options field each sets.
var urlParams = map[string]func(o *Options, v string) error{
	"endpoint":         func(o *Options, v string) error { o.Endpoint = v; return nil },
	"region":           func(o *Options, v string) error { o.Region = v; return nil },
	"shards":           intParam(func(o *Options) *int { return &o.Shards }),
	"scan_concurrency": intParam(func(o *Options) *int { return &o.ScanConcurrency }),
	"page_size":        intParam(func(o *Options) *int { return &o.PageSize }),
	"max_outstanding":  intParam(func(o *Options) *int { return &o.MaxOutstanding }),
	"max_payload":      intParam(func(o *Options) *int { return &o.MaxPayload }),
	"concurrency":      intParam(func(o *Options) *int { return &o.Concurrency }),
	"retention":        durationParam(func(o *Options) *time.Duration { return &o.Retention }),
	"fetch_delay": func(o *Options, v string) error {
		if err := durationParam(func(o *Options) *time.Duration { return &o.FetchDelay })(o, v); err != nil {
			return err
		}
		if o.FetchDelay == 0 {
			o.FetchDelay = FetchDelayNone // 0 would mean "the default"
		}
		return nil
	},
	"outstanding_index":            func(o *Options, v string) error { o.Indexes.Outstanding = v; return nil },
	"delivered_index":              func(o *Options, v string) error { o.Indexes.Delivered = v; return nil },
	"outstanding_all_topics_index": func(o *Options, v string) error { o.Indexes.OutstandingAllTopics = v; return nil },
	"delivered_all_topics_index":   func(o *Options, v string) error { o.Indexes.DeliveredAllTopics = v; return nil },
	"shard_index":                  func(o *Options, v string) error { o.Indexes.Shard = v; return nil },
	"dead_letter_index":            func(o *Options, v string) error { o.Indexes.DeadLettered = v; return nil },
}

func intParam(field func(*Options) *int) func(*Options, string) error {
	return func(o *Options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", v)
		}
		*field(o) = n
		return nil
	}
}

func durationParam(field func(*Options) *time.Duration) func(*Options, string) error {
	return func(o *Options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as 24h, got %q", v)
		}
		*field(o) = d
		return nil
	}
}

// ParseURL parses dynamodb://TABLE?PARAM=VALUE&… into Options (without
// defaults applied; New applies them and validates). Parameters:
// endpoint, region, shards, scan_concurrency, page_size, max_outstanding,
// max_payload, concurrency, retention and fetch_delay (Go durations;
// fetch_delay=0 disables the delay) and the index names
// outstanding_index, delivered_index, outstanding_all_topics_index,
// delivered_all_topics_index, shard_index, dead_letter_index. Example:
//
//	dynamodb://outbox?endpoint=http://127.0.0.1:8000&region=us-east-1&shards=20
func ParseURL(rawURL string) (Options, error) {
	var o Options
	u, err := url.Parse(rawURL)
	if err != nil {
		return o, fmt.Errorf("dynamodb: bad URL: %w", err)
	}
	if u.Scheme != "dynamodb" {
		return o, fmt.Errorf("dynamodb: URL %q must start with dynamodb://TABLE", rawURL)
	}
	if u.User != nil || u.Port() != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return o, fmt.Errorf("dynamodb: URL %q must be dynamodb://TABLE?PARAM=VALUE: put the endpoint in ?endpoint=", rawURL)
	}
	o.Table = u.Host
	if o.Table == "" {
		return o, fmt.Errorf("dynamodb: URL %q names no table: use dynamodb://TABLE", rawURL)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return o, fmt.Errorf("dynamodb: URL %q: bad query: %w", rawURL, err)
	}
	for k, vs := range q {
		set, ok := urlParams[k]
		if !ok {
			return o, fmt.Errorf("dynamodb: URL parameter %q is unknown; known: endpoint, region, shards, scan_concurrency, page_size, max_outstanding, max_payload, concurrency, retention, fetch_delay, *_index", k)
		}
		if len(vs) != 1 {
			return o, fmt.Errorf("dynamodb: URL parameter %q is given %d times; give it once", k, len(vs))
		}
		if err := set(&o, vs[0]); err != nil {
			return o, fmt.Errorf("dynamodb: URL parameter %s: %w", k, err)
		}
	}
	return o, nil
}
