package backends

import (
	"context"
	"net/url"

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
	return sqlite.Open(ctx, path, sqlite.Options{
		TablePrefix: o.TablePrefix,
		Partitions:  o.Partitions,
		MaxPayload:  o.MaxPayload,
		Retention:   o.Retention,
	})
}
