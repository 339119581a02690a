package backends

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/store/postgres"
)

// PostgreSQL store: postgres://user:password@host:5432/db?sslmode=disable
// (postgresql:// too). Every query parameter other than the outbox's own
// (StoreParams) and key_locks (true or false: postgres.Options.KeyLocks of
// the store's writer) goes to pgx.
func init() {
	RegisterStore("postgres", openPostgres)
	RegisterStore("postgresql", openPostgres)
	RegisterMigrationSQL("postgres", postgresMigrationSQL)
	RegisterMigrationSQL("postgresql", postgresMigrationSQL)
}

// postgresMigrationSQL prints the tables' SQL; the URL only names the
// scheme (its host is never contacted).
func postgresMigrationSQL(u *url.URL, o StoreOptions) (string, error) {
	l, err := postgresLayoutParam(u)
	if err != nil {
		return "", err
	}
	return postgres.MigrationSQL(postgres.Options{
		Schema:      o.Schema,
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		Layout:      l,
	})
}

// MigrateWithReport migrates and reports what it did.
func (s postgresStore) MigrateWithReport(ctx context.Context) (MigrateReport, error) {
	rep, err := s.Store.MigrateWithReport(ctx)
	out := MigrateReport{Created: rep.Created, DroppedInvalid: rep.DroppedInvalid, Partitions: rep.Partitions}
	for _, m := range rep.Applied {
		out.Applied = append(out.Applied, m.String())
	}
	if rep.ConvertedToRing {
		out.Applied = append(out.Applied, "ring layout: the outbox table converted online (the former table attached as the child <prefix>_messages_legacy)")
	}
	return out, err
}

// PendingMigrations lists the migrations Migrate would apply.
func (s postgresStore) PendingMigrations(ctx context.Context) ([]string, error) {
	ms, err := s.Store.PendingMigrations(ctx)
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	if err != nil {
		return out, err
	}
	layout, err := s.Store.PendingLayout(ctx)
	if layout != "" {
		out = append(out, layout)
	}
	return out, err
}

// pgParseError is pgx's parse error with the connection string shown as
// redact.URL shows it: pgx redacts its own copy only on a best-effort basis.
func pgParseError(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		return fmt.Sprintf("cannot parse %s: %s", redact.URL(pe.ConnString), msg[i+3:])
	}
	return "cannot parse " + redact.URL(pe.ConnString)
}

// postgresStore adapts *postgres.Store's migration reports. The embedded
// pointer keeps every optional ability (UnorderedStore, PartitionNotifier, Cleaner,
// AdminStore) visible to type assertions.
type postgresStore struct{ *postgres.Store }

func openPostgres(ctx context.Context, u *url.URL, o StoreOptions) (Store, error) {
	q := u.Query()
	var keyLocks *bool
	if vs, ok := q["key_locks"]; ok {
		v, err := strconv.ParseBool(vs[0])
		if err != nil || len(vs) > 1 {
			return nil, Invalid(StoreFlag, "key_locks=%q: give it once, true or false", strings.Join(vs, ","))
		}
		keyLocks = &v
		q.Del("key_locks")
		u.RawQuery = q.Encode()
	}
	layout, err := postgresLayoutParam(u)
	if err != nil {
		return nil, err
	}
	// Catch a malformed DSN (a bad sslmode, port or option) as a usage error
	// before postgres.Open reports it as a connection failure.
	if _, err := pgxpool.ParseConfig(u.String()); err != nil {
		return nil, Invalid(StoreFlag, "is not a valid PostgreSQL URL: %s; want postgres://user:password@host:5432/dbname", pgParseError(err))
	}
	opts := postgres.Options{
		Schema:      o.Schema,
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		MaxPayload:  o.MaxPayload,
		Retention:   o.Retention,
		KeyLocks:    keyLocks,
		Capture:     postgres.Capture(o.Capture),
		Layout:      layout,
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
			return nil, pgRefusal(err)
		}
		if o.Logger != nil {
			s.SetLogger(o.Logger)
		}
		// Its abilities: StreamStore, PartitionNotifier, SlotReader,
		// AdminStore, and Check for the relay's start-up.
		return s, nil
	}
	s, err := postgres.Open(ctx, u.String(), opts)
	if err != nil {
		return nil, pgRefusal(err)
	}
	if o.Logger != nil {
		// The relay's heartbeat warns when the xmin horizon is held.
		s.SetLogger(o.Logger)
	}
	return postgresStore{s}, nil
}

// pgRefusal puts first what the server said when it refused the login:
// pgx reports every attempt (with the default sslmode=prefer, first the
// TLS one the server refused), which buries a wrong password under a TLS
// error and "check that the server is running".
func pgRefusal(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "28P01": // invalid_password
		return fmt.Errorf("PostgreSQL refused the password (%s): check the user and password in --store, with a '@', ':' or '/' in the password percent-encoded: %w", pe.Message, err)
	case "28000": // invalid_authorization_specification: no pg_hba.conf entry
		return fmt.Errorf("PostgreSQL refused the login (%s): pg_hba.conf lets no such connection in; the server may want TLS (?sslmode=verify-full) or another user: %w", pe.Message, err)
	case "3D000": // invalid_catalog_name
		return fmt.Errorf("%s: create the database, or name another in --store (postgres://user@host:5432/DBNAME): %w", pe.Message, err)
	}
	return err
}
