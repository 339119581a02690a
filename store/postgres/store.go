package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
)

// Compile-time checks of the abilities a Store offers.
var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.UnorderedStore    = (*Store)(nil)
	_ outbox.PartitionNotifier = (*Store)(nil)
	_ outbox.Cleaner           = (*Store)(nil)
	_ outbox.AdminStore        = (*Store)(nil)
	_ outbox.HorizonReader     = (*Store)(nil)
)

// Store is the relay side of a PostgreSQL outbox. It implements
// outbox.Store, outbox.UnorderedStore, outbox.PartitionNotifier,
// outbox.Cleaner, and outbox.AdminStore (status and dead letters).
//
// A Store is safe for concurrent use. Every method does one round of I/O (a
// single statement or one batch) and never retries; the relay retries.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool
	opts    Options
	n       names
	q       queries
	writer  *Writer

	partitions atomic.Int64 // P once read; 0 before
	horizon    horizonState // see horizon.go
	claims     claimState   // see unordered.go
	rn         ringNames    // see ring.go
	ring       ringKeeper
	ringLayout atomic.Bool // the table is a ring: see planArgs
	hints      ringHints   // the ring of returned records: see ringsettle.go

	closeCtx context.Context // cancelled by Close: ends subscriptions
	cancel   context.CancelFunc
	subMu    sync.Mutex     // orders wg.Add in Subscribe before Close's wg.Wait
	wg       sync.WaitGroup // subscription goroutines
	closed   atomic.Bool
}

// PoolMaxConnsDefault is the connection limit of a pool made by Open when
// the URL sets no pool_max_conns: enough for a relay's workers to fetch and
// settle concurrently (two connections each at most) and for a heartbeat.
// Connections are opened only when needed.
const PoolMaxConnsDefault = 32

// Open connects to the PostgreSQL database at dsn (a postgres:// URL or a
// key=value connection string) with its own connection pool, which Close
// closes. It checks that the server is reachable; it does not create the
// tables (see Migrate).
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: the store URL is not a valid PostgreSQL connection string (want postgres://user:password@host:5432/dbname): %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// pgxpool's default, max(4, CPUs), starves a relay: each worker
		// fetches and settles beside its publishing, plus the heartbeat.
		cfg.MaxConns = max(cfg.MaxConns, PoolMaxConnsDefault)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: create pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		cc := cfg.ConnConfig
		return nil, fmt.Errorf("postgres: cannot connect to database %q at %s:%d as user %q: check the store URL and that the server is running: %w",
			cc.Database, cc.Host, cc.Port, cc.User, err)
	}
	s, err := newStore(pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// New returns a Store using the caller's pool, which Close leaves open.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: New needs a non-nil *pgxpool.Pool")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return newStore(pool, opts)
}

func newStore(pool *pgxpool.Pool, opts Options) (*Store, error) {
	w, err := NewWriter(opts)
	if err != nil {
		return nil, err
	}
	n := newNames(opts)
	s := &Store{pool: pool, opts: opts, n: n, q: newQueries(n, opts), writer: w, rn: newRingNames(opts)}
	s.closeCtx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Close ends the subscriptions, waits for their goroutines, and closes the
// pool if Open created it. Open claims must be settled or released before.
// Close is idempotent; calls after it return outbox.ErrClosed. It returns
// nil: the error is there for the interface every store and publisher
// shares, Close() error.
func (s *Store) Close() error {
	s.subMu.Lock()
	already := s.closed.Swap(true)
	s.subMu.Unlock()
	if already {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	if s.ownPool {
		s.pool.Close()
	}
	return nil
}

// Pool returns the store's connection pool, for the application's own
// transactions.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Writer returns a Writer with the store's options.
func (s *Store) Writer() *Writer { return s.writer }

// Options returns the store's options, with defaults applied.
func (s *Store) Options() Options { return s.opts }

// check returns outbox.ErrClosed after Close.
func (s *Store) check(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: %s: %w", op, outbox.ErrClosed)
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

// ErrStandby is matched (errors.Is) by the errors of a Store connected to
// a server that accepts no writes: a hot standby (in recovery), or a
// read-only session. A relay needs the primary: a standby cannot hold
// leases nor settle, and its snapshots, the marks of FetchMarked, do not
// show transactions in progress on the primary, so rows that commit late
// there would be skipped. The relay refuses to start on one (Partitions
// fails).
var ErrStandby = errors.New("the server is a hot standby (pg_is_in_recovery) or the session is read-only: a relay needs the primary, whose snapshots show its transactions in progress and which takes writes; point the store URL at the primary (with several hosts, add target_session_attrs=read-write)")

func wrapErr(op string, opts Options, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "25006" { // read_only_sql_transaction
		return fmt.Errorf("postgres: %s: %w: %w", op, ErrStandby, err)
	}
	if missingTables(err) {
		return fmt.Errorf("postgres: %s: the outbox tables do not exist in schema %q with prefix %q: run `outbox migrate --store <url>` (or Store.Migrate) first: %w",
			op, opts.Schema, opts.TablePrefix, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// missingTables reports whether err says a table or schema does not exist.
func missingTables(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000")
}
