package postgres

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Defaults and limits of [Options].
const (
	// SchemaDefault is the default PostgreSQL schema of the outbox tables.
	SchemaDefault = "public"
	// TablePrefixDefault is the default prefix of the outbox table names.
	TablePrefixDefault = "outbox"
	// MaxTablePrefixLen bounds TablePrefix so that every derived name
	// ("<prefix>_dead_letters_failed_idx" is the longest) fits PostgreSQL's
	// 63-byte identifier limit instead of being truncated: 39 bytes.
	MaxTablePrefixLen = storepolicy.MaxTablePrefixLen
	// MaxPayloadLimit bounds Options.MaxPayload (a bytea holds at most 1 GiB).
	MaxPayloadLimit = 256 << 20
	// KeyLocksDefault is the default of Options.KeyLocks.
	KeyLocksDefault = false
)

// Options configures a [Store] and a [Writer]. The zero value of every field
// means its default. A Writer and the Store reading its messages must agree on
// Schema and TablePrefix.
type Options struct {
	// Schema holds the outbox tables; default [SchemaDefault]. It must match
	// ^[A-Za-z_][A-Za-z0-9_]{0,62}$ and is quoted, so it is case-sensitive.
	// It must not be a system schema, information_schema or pg_* (in any
	// case), which pg_dump leaves out. Migrate creates it if missing.
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
	// Inject, if set, adds to each message what the ctx of Write carries
	// for consumers, before the message is validated: the trace context of
	// the writing span, with outboxtrace.Injector (package tracing/otel).
	// Default none: nothing is added.
	Inject outbox.HeaderInjector
	// KeyLocks makes a key's publish order its commit order whatever the
	// order in which the application takes its own locks; default
	// [KeyLocksDefault]. Write then takes a transaction-scoped advisory lock
	// per key (per group of keys for a write of more than 256 keys) before
	// its messages draw their sequence numbers, held until the transaction
	// ends: of two transactions writing a key, the later writer waits for
	// the earlier one to commit or roll back. Without it a key's publish
	// order is its insert order, which is its commit order only when the
	// key's writers are serialised before they call Write (see
	// [Writer.Write]). With it, a transaction that takes one of the
	// application's own locks after Write while another takes that lock
	// before its Write of the same key deadlocks with it: PostgreSQL aborts
	// one of them (SQLSTATE 40P01) after deadlock_timeout; retry it.
	KeyLocks *bool
	// HorizonWarnAfter is how long the database's xmin horizon may be held
	// back (by a session, a prepared transaction or a replication slot)
	// before the relay logs a WARN naming the holder (with capture table:
	// vacuum cannot remove the deleted rows meanwhile, and the relay
	// slows down); default [HorizonWarnAfterDefault]; negative turns the
	// warning off. See [Store.XminHorizon].
	HorizonWarnAfter time.Duration
	// Layout is how Migrate stores the outbox table (capture table):
	// [LayoutPlain], one table whose deleted rows vacuum removes, or
	// [LayoutRing], a ring of partitions the relay truncates once drained,
	// whose cost does not depend on vacuum (choose it when sessions hold
	// the xmin horizon and WAL capture is not possible). Migrate converts
	// a plain table to the ring online; it does not convert back. Empty
	// (the default) keeps the existing layout, [LayoutNew] for a new
	// outbox.
	// Writers need not know it; the relay finds it in the database.
	Layout Layout
	// RingChildren is the number of partitions of the ring, used by
	// Migrate when it creates the ring; default [RingChildrenDefault],
	// between 2 and [RingChildrenMax].
	RingChildren int
	// RingRotate is how often the relay moves the writers on to the next
	// empty partition of the ring; default [RingRotateDefault], at least
	// [RingRotateMin]. The deleted rows statements walk over are about
	// those of two RingRotate periods.
	RingRotate time.Duration
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
		o.Notify = new(true)
	}
	if o.KeyLocks == nil {
		o.KeyLocks = new(KeyLocksDefault)
	}
	o.Capture = cmp.Or(o.Capture, CaptureTable)
	o.HorizonWarnAfter = cmp.Or(o.HorizonWarnAfter, HorizonWarnAfterDefault)
	o.RingRotate = cmp.Or(o.RingRotate, RingRotateDefault)
	o.WAL = o.WAL.withDefaults(o.Schema, o.TablePrefix)
	return o
}

// OptionError reports an invalid field of [Options]. Open, New and
// NewWriter return it before any I/O.
type OptionError struct {
	// Field is the Options field: "Schema", "TablePrefix", "Partitions",
	// "MaxPayload", "Retention", "Capture", "Layout", "RingChildren",
	// "RingRotate" or "WAL.<field>".
	Field string
	// Reason says what is wrong with the value and what to use instead.
	Reason string
}

func (e *OptionError) Error() string { return "postgres: Options." + e.Field + " " + e.Reason }

// Validate reports the first invalid field of o (after defaults) as an
// *[OptionError].
func (o Options) Validate() error { return o.WithDefaults().validate() }

// validate reports the first invalid field of o (after defaults), naming it.
func (o Options) validate() error {
	if err := storepolicy.CheckIdentifier(o.Schema, storepolicy.MaxIdentifierLen); err != nil {
		return &OptionError{"Schema", err.Error()}
	}
	if reservedSchema(o.Schema) {
		return &OptionError{"Schema", fmt.Sprintf("%q is a system schema name (information_schema, pg_*): PostgreSQL reserves it, and pg_dump leaves such schemas out; use another schema, such as %q", o.Schema, SchemaDefault)}
	}
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return &OptionError{"TablePrefix", err.Error() + fmt.Sprintf(" (the longest table or index name, <prefix>%s, must fit PostgreSQL's 63-byte names)", storepolicy.LongestSuffix)}
	}
	if o.Partitions < 0 || o.Partitions > outbox.MaxPartitions {
		return &OptionError{"Partitions", fmt.Sprintf("must be between 1 and %d (0 for the default %d), got %d", outbox.MaxPartitions, outbox.DefaultPartitions, o.Partitions)}
	}
	if o.MaxPayload < 1 || o.MaxPayload > MaxPayloadLimit {
		return &OptionError{"MaxPayload", fmt.Sprintf("must be between 1 and %d bytes (0 for the default %d), got %d", MaxPayloadLimit, outbox.MaxPayloadDefault, o.MaxPayload)}
	}
	if o.Retention < 0 {
		return &OptionError{"Retention", fmt.Sprintf("must not be negative (0 deletes on acknowledgement), got %v", o.Retention)}
	}
	if _, err := ParseCapture(string(o.Capture)); err != nil {
		return &OptionError{"Capture", fmt.Sprintf("must be %q or %q, got %q", CaptureTable, CaptureWAL, o.Capture)}
	}
	if err := o.validateRing(); err != nil {
		return err
	}
	if o.Capture == CaptureWAL {
		if o.Retention > 0 {
			return &OptionError{"Retention", fmt.Sprintf("keeps published rows of the outbox table; with Capture %q nothing is stored: set it to 0", CaptureWAL)}
		}
		return o.WAL.validate()
	}
	return nil
}

// reservedSchema reports whether schema is a system schema name: PostgreSQL
// refuses to create pg_* schemas and pg_dump leaves information_schema and
// pg_* out. Compared without regard to case, since a mixed-case look-alike
// only confuses.
func reservedSchema(schema string) bool {
	s := strings.ToLower(schema)
	return s == "information_schema" || strings.HasPrefix(s, "pg_")
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
	parked       string // capture wal's parked messages
	parkedIdx    string
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
		parked:       q("_parked"),
		parkedIdx:    u("_parked_idx"),
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
