package backends

import (
	"context"
	"errors"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox/store/postgres"
)

// PostgreSQL store: postgres://user:password@host:5432/db?sslmode=disable
// (postgresql:// too). Every query parameter other than the outbox's own
// (StoreParams) goes to pgx.
func init() {
	RegisterStore("postgres", openPostgres)
	RegisterStore("postgresql", openPostgres)
}

// postgresStore adapts *postgres.Store, whose Close returns nothing. The
// embedded pointer keeps every optional ability (UnorderedStore, Notifier,
// Cleaner, StatusReader, DeadLetterStore) visible to type assertions.
type postgresStore struct{ *postgres.Store }

func (s postgresStore) Close() error {
	s.Store.Close()
	return nil
}

func openPostgres(ctx context.Context, u *url.URL, o StoreOptions) (Store, error) {
	// Catch a malformed DSN (a bad sslmode, port or option) as a usage error
	// before postgres.Open reports it as a connection failure.
	if _, err := pgxpool.ParseConfig(u.String()); err != nil {
		return nil, Invalid(StoreFlag, "is not a valid PostgreSQL URL: %v; want postgres://user:password@host:5432/dbname", err)
	}
	opts := postgres.Options{
		Schema:      o.Schema,
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		MaxPayload:  o.MaxPayload,
		Retention:   o.Retention,
		Capture:     postgres.Capture(o.Capture),
	}
	// PostgreSQL's own limits (a prefix short enough for its index names, no
	// system schema) are usage errors naming the flag and URL parameter, not
	// the Go field.
	if err := opts.Validate(); err != nil {
		var oe *postgres.OptionError
		if errors.As(err, &oe) {
			return nil, Invalid(storeOptionFlag(oe.Field), "%s", oe.Reason)
		}
		return nil, err
	}
	if opts.Capture == postgres.CaptureWAL {
		s, err := postgres.OpenWAL(ctx, u.String(), opts)
		if err != nil {
			return nil, err
		}
		if o.Logger != nil {
			s.SetLogger(o.Logger)
		}
		return walStore{s}, nil
	}
	s, err := postgres.Open(ctx, u.String(), opts)
	if err != nil {
		return nil, err
	}
	return postgresStore{s}, nil
}

// walStore adapts *postgres.WALStore (capture wal) the same way; its
// abilities: CommitOrdered, PartitionNotifier, StatusReader, SlotReader,
// DeadLetterStore, and Check for the relay's start-up.
type walStore struct{ *postgres.WALStore }

func (s walStore) Close() error {
	s.WALStore.Close()
	return nil
}
