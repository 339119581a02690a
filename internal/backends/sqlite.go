package backends

import (
	"context"
	"errors"
	"io/fs"
	"net/url"
	"os"

	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// SQLite store, the embedded default: sqlite:///abs/path/outbox.db or
// sqlite://relative/path.db (host and path are joined). One writing process;
// one relay process with any number of workers (see store/sqlite).
func init() {
	RegisterStore("sqlite", openSQLite)
}

func openSQLite(ctx context.Context, u *url.URL, o StoreOptions) (Store, error) {
	if o.Schema != "" {
		return nil, Invalid(StoreFlag, "has schema %q, but SQLite has no schemas: drop --schema (or ?schema=)", o.Schema)
	}
	path := u.Host + u.Path
	if path == "" {
		return nil, Invalid(StoreFlag, "names no database file: want sqlite:///path/to/outbox.db")
	}
	s, err := sqlite.Open(ctx, path, sqlite.Options{
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		MaxPayload:  o.MaxPayload,
		Retention:   o.Retention,
	})
	if err != nil {
		return nil, err
	}
	return sqliteStore{s}, nil
}

// sqliteStore reports whether a migration created the tables. The embedded
// pointer keeps every ability of *sqlite.Store visible to type assertions.
type sqliteStore struct{ *sqlite.Store }

// MigrateWithReport migrates and says whether the tables were created (the
// SQLite migrations are one step: no list of applied migrations).
func (s sqliteStore) MigrateWithReport(ctx context.Context) (MigrateReport, error) {
	_, before := s.Partitions(ctx) // an error: no tables yet
	if err := s.Migrate(ctx); err != nil {
		return MigrateReport{}, err
	}
	p, err := s.Partitions(ctx)
	return MigrateReport{Created: before != nil, Partitions: p}, err
}

// CheckStoreExists returns a *ConfigError when rawURL names an SQLite
// database file that does not exist, so that a command that only reads the
// outbox (status, dlq, console) does not create an empty file for a
// mistyped path. Other stores, and URLs OpenStore would refuse, give nil.
func CheckStoreExists(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "sqlite" || u.Host+u.Path == "" {
		return nil
	}
	path := u.Host + u.Path
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return Invalid(StoreFlag, "the SQLite database %s does not exist; check the path, or create it with outbox migrate --store %s", path, redact.URL(rawURL))
	}
	return nil
}
