package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
)

// storeFlags are the flags naming and shaping a store.
type storeFlags struct {
	url        string
	schema     string
	prefix     string
	partitions int
	retention  time.Duration
	capture    string
}

// storeFlagSet selects the optional store flags a command takes.
type storeFlagSet struct {
	partitions bool // migrate: P is fixed when the tables are created
	retention  bool // relay: keep published messages a while
}

const storeExample = "postgres://user:password@localhost:5432/app"

func (sf *storeFlags) add(fs *pflag.FlagSet, which storeFlagSet) {
	fs.StringVar(&sf.url, "store", "", "outbox store URL, such as "+storeExample+" (query parameters schema, prefix, partitions, retention, capture are read too, and key_locks=true for PostgreSQL writes in commit order per key)")
	fs.StringVar(&sf.schema, "schema", "", "database schema of the outbox tables (default: the store's, public for PostgreSQL)")
	fs.StringVar(&sf.prefix, "table-prefix", "", "prefix of the outbox table names (default: the store's, outbox for PostgreSQL)")
	fs.StringVar(&sf.capture, "capture", "", "how messages are captured: table (rows in the outbox table, the default) or wal (PostgreSQL: writers emit into the write-ahead log, the relay reads a logical replication slot); writers and relays must agree")
	if which.partitions {
		fs.IntVar(&sf.partitions, "partitions", 0, "partition count P, fixed when the tables are created (0: 64)")
	}
	if which.retention {
		fs.DurationVar(&sf.retention, "retention", 0, "keep published messages this long before deleting them (0: delete on acknowledgement)")
	}
}

// options returns the backends options of the flags.
func (sf *storeFlags) options() backends.StoreOptions {
	return backends.StoreOptions{
		Schema:      sf.schema,
		TablePrefix: sf.prefix,
		Partitions:  sf.partitions,
		Retention:   sf.retention,
		Capture:     sf.capture,
	}
}

// check checks the store flags without any I/O. Mistakes are usage errors
// naming the flag.
func (sf *storeFlags) check(a *app) error {
	if sf.url == "" {
		return usagef("--store is required: give the outbox database URL, such as %s, or set %s", storeExample, envName("store"))
	}
	if sf.partitions < 0 {
		return usagef("%s must be between 1 and 4096 (0 for the default 64), got %d", a.flagRef("partitions"), sf.partitions)
	}
	if sf.retention < 0 {
		return usagef("%s must not be negative (0 deletes on acknowledgement), got %v", a.flagRef("retention"), sf.retention)
	}
	return backends.CheckStoreURL(sf.url, sf.options())
}

// open checks the store flags and opens the store.
func (sf *storeFlags) open(ctx context.Context, a *app) (backends.Store, error) {
	if err := sf.check(a); err != nil {
		return nil, err
	}
	o := sf.options()
	o.Logger = a.log
	return backends.OpenStore(ctx, sf.url, o)
}

// timeoutFlag adds --timeout, the bound of a one-shot command.
func timeoutFlag(fs *pflag.FlagSet, d *time.Duration) {
	fs.DurationVar(d, "timeout", time.Minute, "give up after this long")
}

// withTimeout bounds ctx by a positive --timeout.
func (a *app) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc, error) {
	if d <= 0 {
		return nil, nil, usagef("%s must be positive, got %v", a.flagRef("timeout"), d)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, cancel, nil
}

// closeStore closes s, logging a failure.
// openAdmin opens the store for an operator command (status, dlq) and
// checks that it implements outbox.AdminStore; on failure it has closed
// the store.
func (sf *storeFlags) openAdmin(ctx context.Context, a *app, command string) (backends.Store, outbox.AdminStore, error) {
	if err := sf.check(a); err != nil {
		return nil, nil, err
	}
	if err := backends.CheckStoreExists(sf.url); err != nil {
		return nil, nil, err
	}
	s, err := sf.open(ctx, a)
	if err != nil {
		return nil, nil, err
	}
	if s, err = sf.detectCapture(ctx, a, s); err != nil {
		return nil, nil, err
	}
	as, err := adminOf(s, storeScheme(sf.url), command)
	if err != nil {
		a.closeStore(s)
		return nil, nil, err
	}
	return s, as, nil
}

// detectCapture reopens a PostgreSQL store with capture wal when the
// capture mode was not given (--capture, ?capture=) and the outbox is
// captured from the WAL (its replication slot exists): status, the console
// and dlq then show the slot and the streaming relay, and a requeue goes
// into the WAL, where the relay reads.
func (sf *storeFlags) detectCapture(ctx context.Context, a *app, s backends.Store) (backends.Store, error) {
	wc, ok := s.(interface {
		WALCaptured(context.Context) (bool, error)
	})
	if !ok || sf.capture != "" || strings.Contains(sf.url, "capture=") {
		return s, nil
	}
	if yes, err := wc.WALCaptured(ctx); err != nil || !yes {
		return s, nil // the command's own queries report a broken connection
	}
	a.closeStore(s)
	wal := *sf
	wal.capture = backends.CaptureWAL
	a.log.Debug("the outbox is captured from the WAL (its replication slot exists): reading it as --capture wal")
	return wal.open(ctx, a)
}

// adminOf returns s as an outbox.AdminStore, or a usage error naming the
// store (its URL scheme) and the command that needs it.
func adminOf(s backends.Store, scheme, command string) (outbox.AdminStore, error) {
	as, ok := s.(outbox.AdminStore)
	if !ok {
		return nil, usagef("the %s store (%T) does not implement outbox.AdminStore (status and dead letters), which %s needs; use a store such as postgres, sqlite or dynamodb", scheme, s, command)
	}
	return as, nil
}

func (a *app) closeStore(s backends.Store) {
	if err := s.Close(); err != nil {
		a.log.Warn("close store", "err", err)
	}
}

// between checks an integer flag.
func (a *app) between(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usagef("%s must be between %d and %d, got %d", a.flagRef(name), lo, hi, v)
	}
	return nil
}

func (a *app) positiveDuration(name string, d time.Duration) error {
	if d <= 0 {
		return usagef("%s must be positive, got %v", a.flagRef(name), d)
	}
	return nil
}
