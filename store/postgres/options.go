package postgres

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// Defaults and limits of [Options].
const (
	// SchemaDefault is the default PostgreSQL schema of the outbox tables.
	SchemaDefault = "public"
	// TablePrefixDefault is the default prefix of the outbox table names.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix so that every derived name
	// ("<prefix>_dead_letters_failed_idx" is the longest) fits PostgreSQL's
	// 63-byte identifier limit instead of being truncated.
	MaxTablePrefixLen = 63 - len(longestSuffix)
	longestSuffix     = "_dead_letters_failed_idx"
	// MaxPayloadLimit bounds Options.MaxPayload (a bytea holds at most 1 GiB).
	MaxPayloadLimit = 256 << 20
	// maxErrorLen bounds the last_error text stored for a failure.
	maxErrorLen = 4096
)

// identRe is the accepted form of Schema and TablePrefix. They are quoted
// anyway; the rule keeps names portable and readable.
var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Options configures a [Store] and a [Writer]. The zero value of every field
// means its default. A Writer and the Store reading its messages must agree on
// Schema and TablePrefix.
type Options struct {
	// Schema holds the outbox tables; default [SchemaDefault]. It must match
	// ^[A-Za-z_][A-Za-z0-9_]{0,62}$ and is quoted, so it is case-sensitive.
	// Migrate creates it if missing.
	Schema string
	// TablePrefix starts every table name: <prefix>_messages,
	// <prefix>_dead_letters, <prefix>_leases, <prefix>_relays, <prefix>_meta
	// and <prefix>_migrations. Default [TablePrefixDefault]; same rule as
	// Schema, at most [MaxTablePrefixLen] bytes.
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
	// Retention is how long acknowledged messages are kept, marked
	// published, before Cleanup deletes them. Zero (the default) deletes
	// them on acknowledgement.
	Retention time.Duration
	// Notify makes Write send a NOTIFY (delivered on commit) that wakes
	// subscribed relays; default true. The relay polls as well, so turning
	// it off only adds latency. Not used with CaptureWAL.
	Notify *bool
	// Capture is how messages travel from writers to the relay:
	// CaptureTable (the default) or CaptureWAL. Writers and the relay must
	// agree. See the package documentation, "Capture modes".
	Capture Capture
	// WAL configures CaptureWAL; ignored otherwise.
	WAL WALOptions
}

// Capture is how messages travel from writers to the relay.
type Capture string

const (
	// CaptureTable: Write inserts rows into <prefix>_messages; the relay
	// reads them per partition and deletes them once published.
	CaptureTable Capture = "table"
	// CaptureWAL: Write emits each message into the WAL
	// (pg_logical_emit_message) in the application's transaction; nothing
	// is inserted. The relay reads a logical replication slot and gets the
	// messages in commit order. See [WALStore].
	CaptureWAL Capture = "wal"
)

// ParseCapture parses "table" or "wal" (empty means table).
func ParseCapture(s string) (Capture, error) {
	switch Capture(s) {
	case "", CaptureTable:
		return CaptureTable, nil
	case CaptureWAL:
		return CaptureWAL, nil
	}
	return "", fmt.Errorf("capture must be %q or %q, got %q", CaptureTable, CaptureWAL, s)
}

// WithDefaults returns a copy of o with every zero field set to its default.
// Partitions stays zero: it defaults only when Migrate creates the tables.
func (o Options) WithDefaults() Options {
	o.Schema = cmp.Or(o.Schema, SchemaDefault)
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	o.MaxPayload = cmp.Or(o.MaxPayload, outbox.MaxPayloadDefault)
	if o.Notify == nil {
		t := true
		o.Notify = &t
	}
	o.Capture = cmp.Or(o.Capture, CaptureTable)
	o.WAL = o.WAL.withDefaults(o.Schema, o.TablePrefix)
	return o
}

// validate reports the first invalid field of o (after defaults), naming it.
func (o Options) validate() error {
	if !identRe.MatchString(o.Schema) {
		return fmt.Errorf("postgres: Options.Schema %q is not a valid name: use 1 to 63 letters, digits and '_', not starting with a digit", o.Schema)
	}
	if !identRe.MatchString(o.TablePrefix) || len(o.TablePrefix) > MaxTablePrefixLen {
		return fmt.Errorf("postgres: Options.TablePrefix %q is not a valid name: use 1 to %d letters, digits and '_', not starting with a digit", o.TablePrefix, MaxTablePrefixLen)
	}
	if o.Partitions < 0 || o.Partitions > outbox.MaxPartitions {
		return fmt.Errorf("postgres: Options.Partitions must be between 1 and %d (0 for the default %d), got %d", outbox.MaxPartitions, outbox.DefaultPartitions, o.Partitions)
	}
	if o.MaxPayload < 1 || o.MaxPayload > MaxPayloadLimit {
		return fmt.Errorf("postgres: Options.MaxPayload must be between 1 and %d bytes (0 for the default %d), got %d", MaxPayloadLimit, outbox.MaxPayloadDefault, o.MaxPayload)
	}
	if o.Retention < 0 {
		return fmt.Errorf("postgres: Options.Retention must not be negative (0 deletes on acknowledgement), got %v", o.Retention)
	}
	if _, err := ParseCapture(string(o.Capture)); err != nil {
		return fmt.Errorf("postgres: Options.Capture: %w", err)
	}
	if o.Capture == CaptureWAL {
		if o.Retention > 0 {
			return fmt.Errorf("postgres: Options.Retention keeps published rows of the outbox table; with Capture %q nothing is stored: set Retention to 0", CaptureWAL)
		}
		return o.WAL.validate()
	}
	return nil
}

// names holds the quoted, schema-qualified identifiers derived from Options.
type names struct {
	schema       string // quoted schema
	messages     string // quoted, qualified tables
	deadLetters  string
	leases       string
	relays       string
	meta         string
	migrations   string
	pendingIdx   string // quoted, unqualified index names
	publishedIdx string
	failedIdx    string
	txidIdx      string
	deadKeyIdx   string
	deadTopicIdx string
	channel      string // NOTIFY channel, unquoted (a value for pg_notify)
	lockKey      string // advisory lock key text for Migrate
}

func newNames(o Options) names {
	q := func(name string) string { return pgx.Identifier{o.Schema, o.TablePrefix + name}.Sanitize() }
	u := func(name string) string { return pgx.Identifier{o.TablePrefix + name}.Sanitize() }
	return names{
		schema:       pgx.Identifier{o.Schema}.Sanitize(),
		messages:     q("_messages"),
		deadLetters:  q("_dead_letters"),
		leases:       q("_leases"),
		relays:       q("_relays"),
		meta:         q("_meta"),
		migrations:   q("_migrations"),
		pendingIdx:   u("_messages_pending_idx"),
		publishedIdx: u("_messages_published_idx"),
		failedIdx:    u("_dead_letters_failed_idx"),
		txidIdx:      u("_messages_txid_idx"),
		deadKeyIdx:   u("_dead_letters_key_idx"),
		deadTopicIdx: u("_dead_letters_topic_idx"),
		channel:      channelName(o.Schema, o.TablePrefix),
		lockKey:      "outbox.migrate:" + o.Schema + "." + o.TablePrefix,
	}
}

// channelName returns the NOTIFY channel "<schema>.<prefix>", shortened with a
// hash when longer than PostgreSQL's 63-byte identifier limit.
func channelName(schema, prefix string) string {
	c := schema + "." + prefix
	if len(c) <= 63 {
		return c
	}
	sum := sha256.Sum256([]byte(c))
	return c[:54] + "_" + hex.EncodeToString(sum[:4])
}

// Channel returns the LISTEN/NOTIFY channel used by a Writer and a Store with
// these options (after defaults): "<schema>.<prefix>", shortened with a hash
// if longer than 63 bytes.
func (o Options) Channel() string {
	o = o.WithDefaults()
	return channelName(o.Schema, o.TablePrefix)
}
