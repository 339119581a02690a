package backends

import (
	"context"
	"net/url"

	"github.com/outboxrelay/outbox/store/mysql"
)

// MySQL and MariaDB store: mysql://user:password@host:3306/db (the database
// holds the tables). Query parameters other than the outbox's own
// (StoreParams) go to github.com/go-sql-driver/mysql (tls=true, timeout=5s,
// …), except password_file, tls_ca, tls_cert, tls_key and tls_server_name,
// which name files (see mysql.ParseURL).
func init() {
	RegisterStore("mysql", openMySQL)
	RegisterMigrationSQL("mysql", mysqlMigrationSQL)
}

// mysqlMigrationSQL prints the tables' SQL; the URL only names the scheme.
func mysqlMigrationSQL(_ *url.URL, o StoreOptions) (string, error) {
	if o.Schema != "" {
		return "", mysqlSchemaError(o.Schema)
	}
	sql, err := mysql.MigrationSQL(mysql.Options{TablePrefix: o.TablePrefix, Partitions: o.Partitions})
	if err != nil {
		return "", Invalid(StoreFlag, "%v", err)
	}
	return sql, nil
}

func mysqlSchemaError(schema string) error {
	return Invalid("--schema (or ?schema= in --store)", "is %q, but a MySQL store keeps its tables in the URL's database (mysql://user:password@host:3306/DATABASE): drop --schema", schema)
}

// mysqlStore adapts *mysql.Store's migration reports; the embedded
// pointer keeps every optional ability visible to type assertions.
type mysqlStore struct{ *mysql.Store }

// MigrateWithReport migrates and reports what it did.
func (s mysqlStore) MigrateWithReport(ctx context.Context) (MigrateReport, error) {
	rep, err := s.Store.MigrateWithReport(ctx)
	return MigrateReport{Created: rep.Created, Applied: rep.Applied, Partitions: rep.Partitions}, err
}

func openMySQL(ctx context.Context, u *url.URL, o StoreOptions) (Store, error) {
	if o.Schema != "" {
		return nil, mysqlSchemaError(o.Schema)
	}
	if o.Capture != "" && o.Capture != CaptureTable {
		return nil, Invalid("--capture", "must be %q for a MySQL store, got %q", CaptureTable, o.Capture)
	}
	// A malformed URL (parameters, a missing database) is a usage error,
	// found before connecting.
	if _, err := mysql.ParseURL(u.String()); err != nil {
		return nil, Invalid(StoreFlag, "%v", err)
	}
	opts := mysql.Options{
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		MaxPayload:  o.MaxPayload,
		Retention:   o.Retention,
	}
	if err := opts.WithDefaults().Validate(); err != nil {
		return nil, Invalid(StoreFlag, "%v", err)
	}
	s, err := mysql.Open(ctx, u.String(), opts)
	if err != nil {
		return nil, err
	}
	return mysqlStore{s}, nil
}
