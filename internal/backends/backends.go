// Package backends turns the URLs given to the outbox command (--store,
// --broker) into a store or a publisher.
//
// Each backend registers itself from its own file (postgres.go, nats.go,
// sqlite.go, …) with [RegisterStore] or [RegisterBroker] in an init
// function, so adding a backend never edits a shared switch:
//
//	func init() { RegisterStore("postgres", openPostgres) }
//
// [OpenStore] and [OpenPublisher] parse and check the URL, pick the opener by
// scheme, take the outbox's own query parameters off the URL (they are not
// the driver's) and hand the opener the rest. Errors in the URL or the
// options are *[ConfigError]s that name the flag and what to change; the
// command exits with status 2 on them. Other errors (a server that does not
// answer) are runtime failures.
package backends

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"

	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Flag names used in the errors of OpenStore and OpenPublisher.
const (
	StoreFlag  = "--store"
	BrokerFlag = "--broker"
)

// Store is a relay-side store (an outbox.Store, or an outbox.StreamStore for
// PostgreSQL's capture wal) that the command can also migrate and close.
// Openers adapt stores whose Close has another signature with a wrapper.
type Store interface {
	outbox.Source
	// Migrate creates or upgrades the store's tables; running it again is a
	// no-op.
	Migrate(ctx context.Context) error
	// Close releases the store's connections.
	Close() error
}

// StoreOptions are the options of a store common to every backend. The zero
// value of a field means the backend's default. Each may also be given as a
// query parameter of the store URL (see [StoreParams]); giving a field both
// ways with different values is an error.
type StoreOptions struct {
	// Schema is the database schema (PostgreSQL) holding the outbox tables.
	Schema string
	// TablePrefix prefixes every table name.
	TablePrefix string
	// Partitions is P, fixed at migration (default outbox.DefaultPartitions).
	Partitions int
	// Retention keeps published messages this long (0: delete on ack).
	Retention time.Duration
	// MaxPayload bounds a message payload in bytes (default
	// outbox.MaxPayloadDefault).
	MaxPayload int
	// Capture is how the store captures messages: "table" (the default)
	// or "wal" (PostgreSQL only: a logical replication slot).
	Capture string
	// Logger receives the store's own events (the WAL capture's slot
	// taken, lost, standing by); nil discards them.
	Logger *slog.Logger
}

// Capture modes of StoreOptions.Capture.
const (
	CaptureTable = "table"
	CaptureWAL   = "wal"
)

// StoreParams maps the store URL query parameters the outbox reads (and
// removes before the URL reaches the driver) to the StoreOptions field and
// flag they stand for.
var StoreParams = []struct{ Param, Field, Flag string }{
	{"schema", "Schema", "--schema"},
	{"prefix", "TablePrefix", "--table-prefix"},
	{"table_prefix", "TablePrefix", "--table-prefix"},
	{"partitions", "Partitions", "--partitions"},
	{"retention", "Retention", "--retention"},
	{"max_payload", "MaxPayload", "--max-payload"},
	{"capture", "Capture", "--capture"},
}

// BrokerOptions are the options of a publisher common to every broker. The
// zero value of a field means the broker's default. Each may also be given as
// a query parameter of the broker URL (see [BrokerParams]).
type BrokerOptions struct {
	// MaxInFlight bounds the publishes awaiting an acknowledgement.
	MaxInFlight int
	// AckTimeout bounds the wait for one acknowledgement.
	AckTimeout time.Duration
	// SubjectPrefix is put right before every topic (a NATS subject
	// prefix, a Kafka topic prefix, an AMQP routing-key prefix), usually
	// ending with a dot: "outbox." sends topic "orders.created" to
	// "outbox.orders.created".
	SubjectPrefix string
	// Logger receives the publisher's connection events; nil discards them.
	Logger *slog.Logger

	// TLS configures TLS to any broker (NATS, Kafka, amqps://).
	TLS BrokerTLS
	// NATS are the credentials of nats:// and tls:// brokers.
	NATS NATSAuth
	// Kafka are the SASL credentials of kafka:// brokers.
	Kafka KafkaSASL
	// AMQP are the credentials of amqp:// and amqps:// brokers beyond the
	// URL's.
	AMQP AMQPAuth

	// CloudEvents, if set, publishes every message as a CloudEvent (see
	// cloudevents.go for the brokers that can).
	CloudEvents *cloudevents.Options
}

// BrokerParams maps the broker URL query parameters the outbox reads to the
// BrokerOptions field they stand for.
var BrokerParams = []struct{ Param, Field, Flag string }{
	{"max_in_flight", "MaxInFlight", "--max-in-flight"},
	{"ack_timeout", "AckTimeout", "--ack-timeout"},
	{"prefix", "SubjectPrefix", "--subject-prefix"},
}

// StoreOpener opens a store. u is the parsed --store URL without the
// outbox's own query parameters (which are merged into o). An opener returns
// a *ConfigError (see [Invalid]) for a URL or option it cannot accept, and
// does not retry.
type StoreOpener func(ctx context.Context, u *url.URL, o StoreOptions) (Store, error)

// BrokerOpener opens a publisher; u and o as for [StoreOpener].
type BrokerOpener func(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error)

var registry struct {
	mu      sync.RWMutex
	stores  map[string]StoreOpener
	brokers map[string]BrokerOpener
}

// RegisterStore makes a store available under a URL scheme (lower case). It
// panics if the scheme is registered twice or open is nil, like
// database/sql.Register; call it from an init function.
func RegisterStore(scheme string, open StoreOpener) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.stores == nil {
		registry.stores = make(map[string]StoreOpener)
	}
	register(registry.stores, "store", scheme, open, open == nil)
}

// RegisterBroker makes a broker available under a URL scheme (lower case).
// It panics if the scheme is registered twice or open is nil.
func RegisterBroker(scheme string, open BrokerOpener) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.brokers == nil {
		registry.brokers = make(map[string]BrokerOpener)
	}
	register(registry.brokers, "broker", scheme, open, open == nil)
}

func register[T any](m map[string]T, kind, scheme string, open T, isNil bool) {
	if isNil {
		panic("backends: Register" + kind + " " + scheme + ": nil opener")
	}
	if scheme == "" || scheme != strings.ToLower(scheme) {
		panic(fmt.Sprintf("backends: %s scheme %q must be non-empty lower case", kind, scheme))
	}
	if _, dup := m[scheme]; dup {
		panic(fmt.Sprintf("backends: %s scheme %q registered twice", kind, scheme))
	}
	m[scheme] = open
}

// StoreSchemes returns the registered store schemes, sorted.
func StoreSchemes() []string {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return slices.Sorted(maps.Keys(registry.stores))
}

// BrokerSchemes returns the registered broker schemes, sorted.
func BrokerSchemes() []string {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return slices.Sorted(maps.Keys(registry.brokers))
}

// ConfigError is a usage or configuration mistake: a bad URL, an unknown
// scheme, an option out of range. Flag names the flag to change ("--store").
type ConfigError struct {
	Flag string
	Msg  string
	Err  error // optional cause
}

func (e *ConfigError) Error() string {
	if e.Flag == "" {
		return e.Msg
	}
	return e.Flag + ": " + e.Msg
}

func (e *ConfigError) Unwrap() error { return e.Err }

// Invalid returns a *ConfigError for flag with a formatted message. A %w verb
// in format sets Err.
func Invalid(flag, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &ConfigError{Flag: flag, Msg: err.Error(), Err: errors.Unwrap(err)}
}

// IsConfigError reports whether err is or wraps a *ConfigError.
func IsConfigError(err error) bool {
	var ce *ConfigError
	return errors.As(err, &ce)
}

// OpenStore opens the store named by rawURL (the --store flag), such as
// postgres://user:password@host:5432/db?schema=outbox. The URL's query
// parameters listed in [StoreParams] are merged into o and removed; the rest
// go to the driver. Errors in the URL or the options are *ConfigError.
func OpenStore(ctx context.Context, rawURL string, o StoreOptions) (Store, error) {
	u, o, open, err := prepareStore(rawURL, o)
	if err != nil {
		return nil, err
	}
	s, err := open(ctx, u, o)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", redact.URL(u.String()), err)
	}
	return s, nil
}

// prepareStore is OpenStore without the I/O: it parses and checks rawURL,
// merges the outbox's query parameters into o and finds the opener.
func prepareStore(rawURL string, o StoreOptions) (*url.URL, StoreOptions, StoreOpener, error) {
	u, err := parseURL(StoreFlag, rawURL, StoreSchemes(), "postgres://user:password@localhost:5432/app")
	if err != nil {
		return nil, o, nil, err
	}
	registry.mu.RLock()
	open := registry.stores[u.Scheme]
	registry.mu.RUnlock()
	if o, err = storeOptionsFromURL(u, o); err != nil {
		return nil, o, nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, o, nil, err
	}
	if o.Capture == CaptureWAL && u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, o, nil, Invalid("--capture", "wal reads PostgreSQL's write-ahead log: it needs a postgres:// store, not %s://; leave --capture at %q", u.Scheme, CaptureTable)
	}
	return u, o, open, nil
}

// OpenPublisher opens the publisher named by rawURL (the --broker flag), such
// as nats://localhost:4222. The query parameters listed in [BrokerParams] are
// merged into o and removed. Errors in the URL or the options are
// *ConfigError.
func OpenPublisher(ctx context.Context, rawURL string, o BrokerOptions) (outbox.Publisher, error) {
	u, o, open, err := preparePublisher(rawURL, o)
	if err != nil {
		return nil, err
	}
	p, err := open(ctx, u, o)
	if err != nil {
		return nil, fmt.Errorf("open broker %s: %w", redact.URL(u.String()), err)
	}
	return p, nil
}

// preparePublisher is OpenPublisher without the I/O.
func preparePublisher(rawURL string, o BrokerOptions) (*url.URL, BrokerOptions, BrokerOpener, error) {
	u, err := parseURL(BrokerFlag, rawURL, BrokerSchemes(), "nats://localhost:4222")
	if err != nil {
		return nil, o, nil, err
	}
	registry.mu.RLock()
	open := registry.brokers[u.Scheme]
	registry.mu.RUnlock()
	if o, err = brokerOptionsFromURL(u, o); err != nil {
		return nil, o, nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, o, nil, err
	}
	if err := o.checkSecurity(u); err != nil {
		return nil, o, nil, err
	}
	if err := o.checkCloudEvents(u); err != nil {
		return nil, o, nil, err
	}
	return u, o, open, nil
}

// quotedRe matches the quoted input in net/url's errors.
var quotedRe = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// parseURL parses rawURL and checks that its scheme is one of schemes. The
// errors never echo a password.
func parseURL(flag, rawURL string, schemes []string, example string) (*url.URL, error) {
	accepted := "accepted schemes: " + strings.Join(schemes, ", ")
	if len(schemes) == 0 {
		accepted = "no backend is compiled in"
	}
	if strings.TrimSpace(rawURL) == "" {
		return nil, Invalid(flag, "is empty; give a URL such as %s (%s)", example, accepted)
	}
	if !strings.Contains(rawURL, "://") && strings.Contains(rawURL, "=") {
		return nil, Invalid(flag, "takes a URL such as %s, not a keyword/value connection string (host=… password=…)", example)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, password included: keep only the cause.
		// Its cause quotes the piece it could not read, which may be a
		// piece of a password too: show the cause without it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		cause := quotedRe.ReplaceAllString(err.Error(), "…")
		return nil, Invalid(flag, "is not a valid URL (%s); give a URL such as %s, with a '@', ':', '/', '?', '#' or ',' in a user name or password percent-encoded (%%40, %%3A, %%2F, %%3F, %%23, %%2C)", cause, example)
	}
	if u.Scheme == "" {
		return nil, Invalid(flag, "%q has no scheme; give a URL such as %s (%s)", redact.URL(rawURL), example, accepted)
	}
	if !slices.Contains(schemes, u.Scheme) {
		return nil, Invalid(flag, "unknown scheme %q in %q; %s", u.Scheme, redact.URL(rawURL), accepted)
	}
	if u.Fragment != "" {
		// The fragment is not shown: it is most often the tail of a
		// password holding an unencoded '#'.
		return nil, Invalid(flag, "%q has a fragment (a '#' and what follows); remove it, or write a '#' in a password as %%23", redact.URL(rawURL))
	}
	return u, nil
}

// storeOptionsFromURL merges the outbox's query parameters of u into o and
// removes them from u.
func storeOptionsFromURL(u *url.URL, o StoreOptions) (StoreOptions, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return o, Invalid(StoreFlag, "has a malformed query string: %v", err)
	}
	removed := false
	for _, p := range StoreParams {
		vals, ok := q[p.Param]
		if !ok {
			continue
		}
		if len(vals) != 1 {
			return o, Invalid(StoreFlag, "query parameter %q is given %d times; give it once", p.Param, len(vals))
		}
		v := vals[0]
		delete(q, p.Param)
		removed = true
		bad := func(want string) error {
			return Invalid(StoreFlag, "query parameter %s=%q must be %s", p.Param, v, want)
		}
		conflict := func() error {
			return Invalid(StoreFlag, "query parameter %s=%q conflicts with %s; give one of them", p.Param, v, p.Flag)
		}
		switch p.Field {
		case "Schema":
			if o.Schema != "" && o.Schema != v {
				return o, conflict()
			}
			o.Schema = v
		case "TablePrefix":
			if o.TablePrefix != "" && o.TablePrefix != v {
				return o, conflict()
			}
			o.TablePrefix = v
		case "Partitions":
			n, err := strconv.Atoi(v)
			if err != nil {
				return o, bad("an integer")
			}
			if o.Partitions != 0 && o.Partitions != n {
				return o, conflict()
			}
			o.Partitions = n
		case "Retention":
			d, err := time.ParseDuration(v)
			if err != nil {
				return o, bad("a duration such as 24h")
			}
			if o.Retention != 0 && o.Retention != d {
				return o, conflict()
			}
			o.Retention = d
		case "MaxPayload":
			n, err := strconv.Atoi(v)
			if err != nil {
				return o, bad("an integer number of bytes")
			}
			if o.MaxPayload != 0 && o.MaxPayload != n {
				return o, conflict()
			}
			o.MaxPayload = n
		case "Capture":
			if o.Capture != "" && o.Capture != v {
				return o, conflict()
			}
			o.Capture = v
		}
	}
	if removed {
		u.RawQuery = q.Encode()
	}
	return o, nil
}

func brokerOptionsFromURL(u *url.URL, o BrokerOptions) (BrokerOptions, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return o, Invalid(BrokerFlag, "has a malformed query string: %v", err)
	}
	removed := false
	for _, p := range BrokerParams {
		vals, ok := q[p.Param]
		if !ok {
			continue
		}
		if len(vals) != 1 {
			return o, Invalid(BrokerFlag, "query parameter %q is given %d times; give it once", p.Param, len(vals))
		}
		v := vals[0]
		delete(q, p.Param)
		removed = true
		conflict := func() error {
			return Invalid(BrokerFlag, "query parameter %s=%q conflicts with %s; give one of them", p.Param, v, p.Flag)
		}
		switch p.Field {
		case "MaxInFlight":
			n, err := strconv.Atoi(v)
			if err != nil {
				return o, Invalid(BrokerFlag, "query parameter %s=%q must be an integer", p.Param, v)
			}
			if o.MaxInFlight != 0 && o.MaxInFlight != n {
				return o, conflict()
			}
			o.MaxInFlight = n
		case "AckTimeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return o, Invalid(BrokerFlag, "query parameter %s=%q must be a duration such as 5s", p.Param, v)
			}
			if o.AckTimeout != 0 && o.AckTimeout != d {
				return o, conflict()
			}
			o.AckTimeout = d
		case "SubjectPrefix":
			if o.SubjectPrefix != "" && o.SubjectPrefix != v {
				return o, conflict()
			}
			o.SubjectPrefix = v
		}
	}
	if removed {
		u.RawQuery = q.Encode()
	}
	return o, nil
}

// MaxIdentifierLen is the longest schema name accepted, PostgreSQL's
// identifier limit; MaxTablePrefixLen the longest table prefix, which leaves
// room for the longest name the SQL stores derive from it
// ("<prefix>_dead_letters_failed_idx").
const (
	MaxIdentifierLen  = storepolicy.MaxIdentifierLen
	MaxTablePrefixLen = storepolicy.MaxTablePrefixLen
)

// Validate checks the options every backend shares: identifiers are plain
// (letters, digits, '_', not starting with a digit) so that no configuration
// can smuggle SQL, and numbers are in range. Backends validate again.
func (o StoreOptions) Validate() error {
	if o.Schema != "" {
		if err := storepolicy.CheckIdentifier(o.Schema, MaxIdentifierLen); err != nil {
			return Invalid(storeOptionFlag("Schema"), "%v", err)
		}
	}
	if o.TablePrefix != "" {
		if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
			return Invalid(storeOptionFlag("TablePrefix"), "%v", err)
		}
	}
	if o.Partitions < 0 || o.Partitions > outbox.MaxPartitions {
		return Invalid(storeOptionFlag("Partitions"), "must be between 1 and %d (0 for the default %d), got %d", outbox.MaxPartitions, outbox.DefaultPartitions, o.Partitions)
	}
	if o.Retention < 0 {
		return Invalid(storeOptionFlag("Retention"), "must not be negative, got %v", o.Retention)
	}
	if o.MaxPayload < 0 {
		return Invalid(storeOptionFlag("MaxPayload"), "must not be negative, got %d", o.MaxPayload)
	}
	return nil
}

// storeOptionFlag names where the StoreOptions field is set, for errors:
// its flag and its --store query parameter, such as "--table-prefix (or
// ?prefix= in --store)".
func storeOptionFlag(field string) string {
	for _, p := range StoreParams {
		if p.Field == field {
			return fmt.Sprintf("%s (or ?%s= in %s)", p.Flag, p.Param, StoreFlag)
		}
	}
	return StoreFlag
}

// Validate checks the options every broker shares.
func (o BrokerOptions) Validate() error {
	if o.MaxInFlight < 0 {
		return Invalid("--max-in-flight", "must not be negative, got %d", o.MaxInFlight)
	}
	if o.AckTimeout < 0 {
		return Invalid("--ack-timeout", "must not be negative, got %v", o.AckTimeout)
	}
	if o.SubjectPrefix != "" {
		// The prefix goes right before the topic, usually ending with a
		// dot ("outbox."); without that dot it must still be a topic.
		if err := outbox.ValidateTopic(strings.TrimSuffix(o.SubjectPrefix, ".")); err != nil {
			return Invalid("--subject-prefix", "%v; use tokens of letters, digits, '_' and '-' separated by dots, such as outbox.", err)
		}
	}
	return nil
}

// CheckStoreURL reports the *ConfigError OpenStore would return for rawURL
// and o, without any I/O, so that a command can check every flag before it
// connects to anything.
func CheckStoreURL(rawURL string, o StoreOptions) error {
	_, _, _, err := prepareStore(rawURL, o)
	return err
}

// CheckBrokerURL reports the *ConfigError OpenPublisher would return for
// rawURL and o, without any I/O.
func CheckBrokerURL(rawURL string, o BrokerOptions) error {
	_, _, _, err := preparePublisher(rawURL, o)
	return err
}

// MigrateReport is what a migration did, for stores that can tell (see
// [MigrateReporter]).
type MigrateReport struct {
	Created        bool     // the tables did not exist before
	Applied        []string // the migrations applied, such as "0003_txid_index (CREATE INDEX CONCURRENTLY)"
	DroppedInvalid []string // invalid indexes of failed concurrent builds, dropped and built again
	Partitions     int      // P
}

// MigrateReporter is a Store whose migration reports what it did.
type MigrateReporter interface {
	MigrateWithReport(ctx context.Context) (MigrateReport, error)
}

// MigrationPlanner is a Store that can tell which migrations Migrate would
// apply, without applying them (outbox migrate --dry-run).
type MigrationPlanner interface {
	PendingMigrations(ctx context.Context) ([]string, error)
}

var sqlPrinters = map[string]func(u *url.URL, o StoreOptions) (string, error){}

// RegisterMigrationSQL makes `outbox migrate --print-sql` available for a
// store scheme: print returns the SQL that creates the tables for o.
// Call it from an init function.
func RegisterMigrationSQL(scheme string, print func(u *url.URL, o StoreOptions) (string, error)) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	register(sqlPrinters, "migration SQL", scheme, print, print == nil)
}

// MigrationSQL returns the SQL that creates the tables of the store named by
// rawURL with options o, without connecting. Stores without SQL (or
// without a printer) give a *ConfigError.
func MigrationSQL(rawURL string, o StoreOptions) (string, error) {
	u, o, _, err := prepareStore(rawURL, o)
	if err != nil {
		return "", err
	}
	registry.mu.RLock()
	print := sqlPrinters[u.Scheme]
	registry.mu.RUnlock()
	if print == nil {
		return "", Invalid(StoreFlag, "--print-sql prints the PostgreSQL migrations; %s:// stores have none to print", u.Scheme)
	}
	return print(u, o)
}
