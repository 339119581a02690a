package sqlite

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Defaults and limits of [Options].
const (
	// TablePrefixDefault is the default prefix of the outbox table names.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix: the same bound as the PostgreSQL
	// store (39 bytes, so that "<prefix>_dead_letters_failed_idx", the
	// longest name either derives, fits PostgreSQL's 63-byte identifiers),
	// so that one prefix works for both.
	MaxTablePrefixLen = storepolicy.MaxTablePrefixLen
	// MaxPayloadLimit bounds Options.MaxPayload. SQLite's own limit on a
	// BLOB is 1 GB; a relay holds up to FetchSize payloads in memory.
	MaxPayloadLimit = 256 << 20
	// BusyTimeoutDefault is how long a write waits for the database's write
	// lock before failing with "database is locked".
	BusyTimeoutDefault = 5 * time.Second
	// maxVariables bounds the bound parameters of one statement. SQLite
	// accepts 32766 since 3.32; staying far below keeps statements small.
	maxVariables = 7000
)

// Options configures a [Store]. The zero value of every field means its
// default.
type Options struct {
	// TablePrefix starts every table name: <prefix>_messages,
	// <prefix>_dead_letters, <prefix>_leases, <prefix>_relays, <prefix>_meta
	// and <prefix>_migrations. Default [TablePrefixDefault]; 1 to
	// [MaxTablePrefixLen] letters, digits and '_', not starting with a digit.
	// SQLite compares table names case-insensitively, so "Outbox" and
	// "outbox" name the same tables.
	TablePrefix string
	// Partitions is P, the partition count, used only by Migrate when it
	// creates the tables (default outbox.DefaultPartitions, at most
	// outbox.MaxPartitions). Afterwards P is read from the meta table; zero
	// then means "whatever is stored", and a different non-zero value makes
	// Migrate fail.
	Partitions int
	// MaxPayload bounds a message's payload in bytes; default
	// outbox.MaxPayloadDefault, at most [MaxPayloadLimit].
	MaxPayload int
	// Inject, if set, adds to each message what the ctx of Write carries
	// for consumers, before the message is validated: the trace context of
	// the writing span, with outboxtrace.Injector (package tracing/otel).
	// Default none: nothing is added.
	Inject outbox.HeaderInjector
	// Retention is how long acknowledged messages are kept, marked
	// published, before Cleanup deletes them. Zero (the default) deletes
	// them on acknowledgement.
	Retention time.Duration
	// BusyTimeout is how long a write transaction of a database made by
	// Open waits for the write lock: SQLite's busy_timeout, and the wait in
	// the in-process write queue. Default [BusyTimeoutDefault]. New leaves
	// the caller's connections as they are and does not use it.
	BusyTimeout time.Duration
	// Now is the store's clock for leases, heartbeats, due retries of
	// unordered claims, retention and CreatedAt; default time.Now. Every relay node using the same
	// database must share one clock, which is natural as they all run in one
	// process (see the package documentation). Tests inject their own.
	Now func() time.Time
}

// WithDefaults returns a copy of o with every zero field set to its default.
// Partitions stays zero: it defaults only when Migrate creates the tables.
func (o Options) WithDefaults() Options {
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	o.MaxPayload = cmp.Or(o.MaxPayload, outbox.MaxPayloadDefault)
	o.BusyTimeout = cmp.Or(o.BusyTimeout, BusyTimeoutDefault)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// validate reports the first invalid field of o (after defaults), naming it.
func (o Options) validate() error {
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return fmt.Errorf("sqlite: Options.TablePrefix %w", err)
	}
	if strings.HasPrefix(strings.ToLower(o.TablePrefix), "sqlite_") {
		return fmt.Errorf("sqlite: Options.TablePrefix %q is reserved: SQLite keeps names starting with \"sqlite_\" for itself; choose another prefix", o.TablePrefix)
	}
	if o.Partitions < 0 || o.Partitions > outbox.MaxPartitions {
		return fmt.Errorf("sqlite: Options.Partitions must be between 1 and %d (0 for the default %d), got %d", outbox.MaxPartitions, outbox.DefaultPartitions, o.Partitions)
	}
	if o.MaxPayload < 1 || o.MaxPayload > MaxPayloadLimit {
		return fmt.Errorf("sqlite: Options.MaxPayload must be between 1 and %d bytes (0 for the default %d), got %d", MaxPayloadLimit, outbox.MaxPayloadDefault, o.MaxPayload)
	}
	if o.Retention < 0 {
		return fmt.Errorf("sqlite: Options.Retention must not be negative (0 deletes on acknowledgement), got %v", o.Retention)
	}
	if o.BusyTimeout < time.Millisecond {
		return fmt.Errorf("sqlite: Options.BusyTimeout must be at least 1ms (0 for the default %v), got %v", BusyTimeoutDefault, o.BusyTimeout)
	}
	return nil
}

// names holds the quoted identifiers derived from Options.
type names struct {
	messages     string
	deadLetters  string
	leases       string
	relays       string
	meta         string
	migrations   string
	pendingIdx   string
	publishedIdx string
	failedIdx    string
	deadKeyIdx   string
	deadTopicIdx string
}

func newNames(o Options) names {
	q := func(name string) string { return quoteIdent(o.TablePrefix + name) }
	return names{
		messages:     q("_messages"),
		deadLetters:  q("_dead_letters"),
		leases:       q("_leases"),
		relays:       q("_relays"),
		meta:         q("_meta"),
		migrations:   q("_migrations"),
		pendingIdx:   q("_messages_pending_idx"),
		publishedIdx: q("_messages_published_idx"),
		failedIdx:    q("_dead_letters_failed_idx"),
		deadKeyIdx:   q("_dead_letters_key_idx"),
		deadTopicIdx: q("_dead_letters_topic_idx"),
	}
}

// quoteIdent quotes an SQLite identifier. Callers validate names first; the
// quoting is a second line of defence.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
