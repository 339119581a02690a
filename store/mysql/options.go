package mysql

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
	// MaxTablePrefixLen bounds TablePrefix: the bound the other SQL
	// stores use, so that one prefix works for all of them (MySQL allows
	// 64-byte table names; "<prefix>_dead_letters" is the longest).
	MaxTablePrefixLen = storepolicy.MaxTablePrefixLen
	// MaxPayloadLimit bounds Options.MaxPayload. A LONGBLOB holds 4 GiB;
	// a write must also fit the server's max_allowed_packet (16 MiB by
	// default on MariaDB, 64 MiB on MySQL 8).
	MaxPayloadLimit = 15 << 20
	// maxParams bounds the bound parameters of one statement (the
	// protocol allows 65,535).
	maxParams = 10000
	// maxInsertBytes bounds the payload and header bytes of one INSERT of
	// Write, to stay well under max_allowed_packet.
	maxInsertBytes = 4 << 20
)

// Options configures a [Store]. The zero value of every field means its
// default.
type Options struct {
	// TablePrefix starts every table name: <prefix>_messages,
	// <prefix>_dead_letters, <prefix>_leases, <prefix>_relays, <prefix>_meta
	// and <prefix>_migrations, in the database of the connection. Default
	// [TablePrefixDefault]; 1 to [MaxTablePrefixLen] letters, digits and
	// '_', not starting with a digit.
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
	// Inject, if set, adds to each message what the ctx of Write carries
	// for consumers, before the message is validated (the trace context of
	// the writing span). Default none.
	Inject outbox.HeaderInjector
	// Now is the store's clock for CreatedAt set by Write and dead
	// letters' failure time; default time.Now. Leases, heartbeats, due
	// retries of claims and retention use the server's clock
	// (UTC_TIMESTAMP), which every relay process shares.
	Now func() time.Time
}

// WithDefaults returns a copy of o with every zero field set to its default.
// Partitions stays zero: it defaults only when Migrate creates the tables.
func (o Options) WithDefaults() Options {
	o.TablePrefix = cmp.Or(o.TablePrefix, TablePrefixDefault)
	o.MaxPayload = cmp.Or(o.MaxPayload, outbox.MaxPayloadDefault)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports the first invalid field of o (after defaults), naming it.
func (o Options) Validate() error {
	if err := storepolicy.CheckIdentifier(o.TablePrefix, MaxTablePrefixLen); err != nil {
		return fmt.Errorf("mysql: Options.TablePrefix %w", err)
	}
	if o.Partitions < 0 || o.Partitions > outbox.MaxPartitions {
		return fmt.Errorf("mysql: Options.Partitions must be between 1 and %d (0 for the default %d), got %d", outbox.MaxPartitions, outbox.DefaultPartitions, o.Partitions)
	}
	if o.MaxPayload < 1 || o.MaxPayload > MaxPayloadLimit {
		return fmt.Errorf("mysql: Options.MaxPayload must be between 1 and %d bytes (0 for the default %d), got %d", MaxPayloadLimit, outbox.MaxPayloadDefault, o.MaxPayload)
	}
	if o.Retention < 0 {
		return fmt.Errorf("mysql: Options.Retention must not be negative (0 deletes on acknowledgement), got %v", o.Retention)
	}
	return nil
}

// names holds the quoted identifiers derived from Options.
type names struct {
	messages    string
	deadLetters string
	leases      string
	relays      string
	meta        string
	migrations  string
}

func newNames(o Options) names {
	q := func(name string) string { return quoteIdent(o.TablePrefix + name) }
	return names{
		messages:    q("_messages"),
		deadLetters: q("_dead_letters"),
		leases:      q("_leases"),
		relays:      q("_relays"),
		meta:        q("_meta"),
		migrations:  q("_migrations"),
	}
}

// quoteIdent quotes a MySQL identifier. Callers validate names first; the
// quoting is a second line of defence.
func quoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

// placeholders returns "?, ?, …" with n placeholders.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}
