package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/localnotify"
)

// Compile-time checks of the abilities a Store offers.
var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.UnorderedStore    = (*Store)(nil)
	_ outbox.CommitOrdered     = (*Store)(nil)
	_ outbox.PartitionNotifier = (*Store)(nil)
	_ outbox.Cleaner           = (*Store)(nil)
	_ outbox.AdminStore        = (*Store)(nil)
)

// maxIdleConns is how many idle connections a database opened by Open
// keeps; opening one runs the connection pragmas, so a few stay ready.
const maxIdleConns = 8

// Store is the relay side of an SQLite outbox, and writes messages with
// [Store.Write]. It implements outbox.Store, outbox.UnorderedStore,
// outbox.PartitionNotifier, outbox.Cleaner,
// and outbox.AdminStore (status and dead letters).
//
// A Store is safe for concurrent use. Every method does one round of work
// (one transaction at most) and never retries; the relay retries.
type Store struct {
	db    *sql.DB
	ownDB bool
	opts  Options
	n     names
	q     queries
	gate  *gate // the write gate of a database made by Open; nil for New

	partitions atomic.Int64 // P once read; 0 before
	bc         localnotify.Broadcaster
	closed     atomic.Bool

	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt // prepared on db, by query text

	// fetchMu guards fetchTexts, the Fetch statements by limit (see
	// fetchQuery).
	fetchMu    sync.Mutex
	fetchTexts map[int]*[len(cursorGroups)]string

	// claimMu serialises ClaimUnordered and the end of claims; claimed holds
	// the IDs of the records of open claims.
	claimMu sync.Mutex
	claimed map[string]struct{}
}

// Open opens (creating it if needed) the SQLite database at path with its own
// *sql.DB, which Close closes. It does not create the tables (see Migrate).
//
// path is a file name or a "file:" URI (https://www.sqlite.org/uri.html)
// that may carry modernc.org/sqlite parameters. Unless the URI sets them,
// Open sets on every connection: journal_mode=WAL (readers do not block the
// writer), busy_timeout=Options.BusyTimeout, synchronous=NORMAL (a commit
// is durable once the WAL is checkpointed; a power loss, not a process
// crash, can lose the last commits), foreign_keys=ON, and _txlock=immediate
// (every transaction not begun read-only takes the write lock at BEGIN, so
// that it waits under busy_timeout instead of failing with SQLITE_BUSY when
// it first writes). Write transactions of this process also queue in FIFO
// order for the write lock (see [Options.BusyTimeout]), and commits of
// transactions that wrote messages wake relays subscribed to this store.
//
// Use [Store.DB] for the application's own transactions, so that they share
// the write queue and the notifications. Do not call the Store's methods
// that write (Settle, AcquireLeases, …) from a goroutine that holds a write
// transaction of the same database: they wait for it, up to BusyTimeout.
// A ":memory:" database is refused: each connection would see its own empty
// database.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	dsn, err := buildDSN(path, opts.BusyTimeout)
	if err != nil {
		return nil, err
	}
	base, err := msqlite.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %q: %w", path, err)
	}
	s := newStore(nil, opts)
	s.gate = newGate(opts.BusyTimeout)
	s.db = sql.OpenDB(&connector{base: base, gate: s.gate, notify: s.bc.Kick})
	s.db.SetMaxIdleConns(maxIdleConns)
	s.ownDB = true
	if err := s.db.PingContext(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("sqlite: cannot open database %q: check that its directory exists and is writable: %w", path, err)
	}
	return s, nil
}

// New returns a Store using the caller's database, opened with the
// modernc.org/sqlite driver, which Close leaves open. The database should be
// in WAL mode with a busy_timeout; open it with _txlock=immediate so that
// the application's write transactions wait for the write lock rather than
// fail with SQLITE_BUSY (the store's own transactions begin IMMEDIATE
// whatever the setting). Notifications from [Store.Write] are sent before
// the caller's commit (see [Store.Subscribe]); [Open] does better.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlite: New needs a non-nil *sql.DB")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return newStore(db, opts), nil
}

func newStore(db *sql.DB, opts Options) *Store {
	n := newNames(opts)
	return &Store{db: db, opts: opts, n: n, q: newQueries(n), claimed: make(map[string]struct{}), stmts: make(map[string]*sql.Stmt)}
}

// buildDSN turns Open's path into a "file:" URI with the store's connection
// settings added where the caller did not set them.
func buildDSN(path string, busy time.Duration) (string, error) {
	switch strings.TrimSpace(path) {
	case "":
		return "", errors.New("sqlite: Open needs a database path, such as \"outbox.db\" or \"file:/var/lib/app/outbox.db\"")
	case ":memory:":
		return "", errors.New("sqlite: Open refuses \":memory:\": every connection would get its own empty database; use a file (a temporary directory will do)")
	}
	uri, query := path, ""
	if strings.HasPrefix(path, "file:") {
		if i := strings.IndexByte(path, '?'); i >= 0 {
			uri, query = path[:i], path[i+1:]
		}
	} else {
		// A plain name: escape it, so that '?', '#' and '%' in it stay part
		// of the name.
		uri = "file:" + (&url.URL{Path: path}).EscapedPath()
	}
	vals, err := url.ParseQuery(query)
	if err != nil {
		return "", fmt.Errorf("sqlite: Open: the query of %q does not parse: %w", path, err)
	}
	if vals.Get("mode") == "memory" || strings.HasPrefix(uri, "file::memory:") {
		return "", errors.New("sqlite: Open refuses in-memory databases: WAL mode and the relay's concurrent connections need a file (a temporary directory will do)")
	}
	has := func(pragma string) bool {
		for _, p := range vals["_pragma"] {
			if strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), pragma) {
				return true
			}
		}
		return false
	}
	extra := []string{}
	for _, p := range []struct{ name, value string }{
		{"busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10)},
		{"journal_mode", "WAL"},
		{"synchronous", "NORMAL"},
		{"foreign_keys", "ON"},
	} {
		if !has(p.name) {
			extra = append(extra, "_pragma="+url.QueryEscape(p.name+"("+p.value+")"))
		}
	}
	if vals.Get("_txlock") == "" {
		extra = append(extra, "_txlock=immediate")
	}
	parts := extra
	if query != "" {
		parts = append([]string{query}, extra...)
	}
	if len(parts) == 0 {
		return uri, nil
	}
	return uri + "?" + strings.Join(parts, "&"), nil
}

// DB returns the store's database, for the application's own transactions.
func (s *Store) DB() *sql.DB { return s.db }

// Options returns the store's options, with defaults applied.
func (s *Store) Options() Options { return s.opts }

// Close ends the subscriptions and closes the database if Open opened it.
// Open claims must be settled or released before. Close is idempotent;
// calls after it return outbox.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.bc.Close()
	s.stmtMu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	clear(s.stmts)
	s.stmtMu.Unlock()
	if s.ownDB {
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("sqlite: close: %w", err)
		}
	}
	return nil
}

// check returns outbox.ErrClosed after Close.
func (s *Store) check(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("sqlite: %s: %w", op, outbox.ErrClosed)
	}
	return nil
}

// wrap adds the operation to err and, when the tables are missing, says how
// to create them.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return wrapErr(op, s.opts, err)
}

func wrapErr(op string, opts Options, err error) error {
	if missingTables(err) {
		return fmt.Errorf("sqlite: %s: the outbox tables with prefix %q do not exist: run `outbox migrate --store <path>` (or Store.Migrate) first: %w",
			op, opts.TablePrefix, err)
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

// missingTables reports whether err says a table does not exist.
func missingTables(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// now is the store's clock.
func (s *Store) now() time.Time { return s.opts.Now() }

// Partitions returns P, read from the meta table once and then cached.
func (s *Store) Partitions(ctx context.Context) (int, error) {
	if err := s.check("partitions"); err != nil {
		return 0, err
	}
	if p := s.partitions.Load(); p > 0 {
		return int(p), nil
	}
	p, err := readPartitions(ctx, s.db, s.n)
	if err != nil {
		return 0, s.wrap("partitions", err)
	}
	s.partitions.Store(int64(p))
	return p, nil
}

// prepared returns query prepared on the store's database, once: database/sql
// then prepares it at most once per connection, so the hot statements are
// parsed and planned once, not per call.
func (s *Store) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if st, ok := s.stmts[query]; ok {
		return st, nil
	}
	if s.closed.Load() {
		return nil, outbox.ErrClosed
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.stmts[query] = st
	return st, nil
}

// queryer is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// errNotMigrated reports an empty meta table.
var errNotMigrated = errors.New("the meta table has no partition count")

func readPartitions(ctx context.Context, q queryer, n names) (int, error) {
	var p int
	err := q.QueryRowContext(ctx, "SELECT partitions FROM "+n.meta+" WHERE singleton = 1").Scan(&p)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: run `outbox migrate --store <path>` (or Store.Migrate)", errNotMigrated)
	}
	return p, err
}

// inTx runs fn in a write transaction (BEGIN IMMEDIATE) on one connection and
// commits it, or rolls it back if fn or the commit fails. fn's error is
// returned as is; the caller wraps it.
func (s *Store) inTx(ctx context.Context, fn func(c *sql.Conn) error) (err error) {
	if s.gate != nil {
		if err := s.gate.acquire(ctx); err != nil {
			return err
		}
		defer s.gate.release()
	}
	c, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			rollback(ctx, c)
		}
	}()
	if err := fn(c); err != nil {
		return err
	}
	_, err = c.ExecContext(ctx, "COMMIT")
	return err
}

// rollback ends the transaction open on c, if any. If that fails, c is
// discarded, so that no connection goes back to the pool inside a
// transaction.
func rollback(ctx context.Context, c *sql.Conn) {
	_, err := c.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	if err != nil && !strings.Contains(err.Error(), "no transaction is active") {
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// readTx runs fn in a read-only transaction: one consistent snapshot that
// does not wait for writers.
func (s *Store) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// nanos converts a time to the stored form, Unix nanoseconds.
func nanos(t time.Time) int64 { return t.UnixNano() }

// fromNanos converts a stored time back; NULL (invalid) is the zero time.
func fromNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// CommitOrdered implements outbox.CommitOrdered: SQLite serialises write
// transactions and Seq is assigned inside them, so Seq order is commit
// order and the relay never needs to sweep below its cursors.
func (s *Store) CommitOrdered() {}
