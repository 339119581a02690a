package mysql

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/localnotify"
)

// Compile-time checks of the abilities a Store offers.
var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.UnorderedStore    = (*Store)(nil)
	_ outbox.PartitionNotifier = (*Store)(nil)
	_ outbox.Cleaner           = (*Store)(nil)
	_ outbox.AdminStore        = (*Store)(nil)
	_ outbox.BacklogReader     = (*Store)(nil)
	_ outbox.LeaseReader       = (*Store)(nil)
	_ outbox.MarkedFetcher     = (*Store)(nil)
)

// MaxOpenConnsDefault is the connection limit of a database opened by Open:
// enough for a relay's workers to fetch and settle concurrently and for a
// heartbeat, as PostgreSQL's pool.
const MaxOpenConnsDefault = 32

// Store is the relay side of a MySQL or MariaDB outbox, and writes messages
// with [Store.Write]. It implements outbox.Store, outbox.UnorderedStore,
// outbox.PartitionNotifier, outbox.Cleaner, outbox.BacklogReader,
// outbox.LeaseReader and outbox.AdminStore.
//
// A Store is safe for concurrent use. Every method does one round of work
// (one statement or one transaction) and never retries; the relay retries.
type Store struct {
	db    *sql.DB
	ownDB bool
	// dirty reads at READ UNCOMMITTED (a database of Open, whose
	// connections set it for their session); nil with New, whose dirty
	// reads run in transactions.
	dirty *sql.DB
	opts  Options
	n     names
	q     queries

	partitions atomic.Int64 // P once read; 0 before
	bc         localnotify.Broadcaster
	closed     atomic.Bool
}

// ParseURL turns a store URL into a driver configuration: a mysql:// URL
// (mysql://user:password@host:3306/dbname?tls=true) or the driver's own DSN
// (user:password@tcp(host:3306)/dbname). The query parameters of a
// mysql:// URL are github.com/go-sql-driver/mysql's, plus these, which read
// secrets from files so that they appear neither in the URL nor in the
// process list: password_file (the password, trailing newline dropped),
// tls_ca (PEM CAs to verify the server with; implies TLS), tls_cert and
// tls_key (a client certificate and its key, for mutual TLS), and
// tls_server_name (the name to verify, default the host). The store needs, and sets,
// parseTime=true and loc=UTC, and sets interpolateParams=true (one round
// trip per statement instead of three) unless the URL sets it.
func ParseURL(dsn string) (*mysql.Config, error) {
	var cfg *mysql.Config
	if rest, ok := strings.CutPrefix(dsn, "mysql://"); ok {
		u, err := url.Parse("mysql://" + rest)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // url.Error repeats the URL, password included
			}
			return nil, fmt.Errorf("mysql: the store URL does not parse (want mysql://user:password@host:3306/dbname): %w", err)
		}
		q := u.Query()
		files, err := takeFileParams(q)
		if err != nil {
			return nil, err
		}
		u.RawQuery = q.Encode()
		host := u.Host
		if host == "" {
			host = "127.0.0.1:3306"
		} else if u.Port() == "" {
			host += ":3306"
		}
		cfg, err = mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
		if err != nil {
			return nil, fmt.Errorf("mysql: the store URL's parameters are not valid: %w", err)
		}
		if u.User != nil {
			cfg.User = u.User.Username()
			cfg.Passwd, _ = u.User.Password()
		}
		if err := files.apply(cfg); err != nil {
			return nil, err
		}
		if !u.Query().Has("interpolateParams") {
			cfg.InterpolateParams = true
		}
	} else {
		var err error
		cfg, err = mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("mysql: the store DSN is not valid (want mysql://user:password@host:3306/dbname or user:password@tcp(host:3306)/dbname): %w", err)
		}
		if !strings.Contains(dsn, "interpolateParams") {
			cfg.InterpolateParams = true
		}
	}
	if cfg.DBName == "" {
		return nil, errors.New("mysql: the store URL names no database: want mysql://user:password@host:3306/dbname")
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return cfg, nil
}

// Open connects to the database at dsn (see [ParseURL]) with its own
// *sql.DB, which Close closes. It checks that the server is reachable; it
// does not create the tables (see Migrate). Writes made with Store.Write in
// transactions of [Store.DB] wake the relays of this Store when they
// commit (see [Store.SubscribePartitions]).
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cfg, err := ParseURL(dsn)
	if err != nil {
		return nil, err
	}
	base, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	s := newStore(nil, opts)
	s.db = sql.OpenDB(&connector{base: base, notify: s.bc.Kick})
	s.db.SetMaxOpenConns(MaxOpenConnsDefault)
	s.db.SetMaxIdleConns(MaxOpenConnsDefault)
	s.db.SetConnMaxIdleTime(5 * time.Minute)
	s.ownDB = true
	var version string
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("mysql: cannot connect to database %q at %s as user %q: check the store URL and that the server is running: %w",
			cfg.DBName, cfg.Addr, cfg.User, err)
	}
	// The session variable of the isolation level: MariaDB's tx_isolation
	// (transaction_isolation only from 11.1), MySQL 8's
	// transaction_isolation (tx_isolation was removed in 8.0).
	dcfg := cfg.Clone()
	if dcfg.Params == nil {
		dcfg.Params = map[string]string{}
	}
	if strings.Contains(version, "MariaDB") {
		dcfg.Params["tx_isolation"] = "'READ-UNCOMMITTED'"
	} else {
		dcfg.Params["transaction_isolation"] = "'READ-UNCOMMITTED'"
	}
	dconn, err := mysql.NewConnector(dcfg)
	if err != nil {
		s.db.Close()
		return nil, fmt.Errorf("mysql: %w", err)
	}
	s.dirty = sql.OpenDB(dconn)
	s.dirty.SetMaxOpenConns(MaxOpenConnsDefault)
	s.dirty.SetMaxIdleConns(4)
	s.dirty.SetConnMaxIdleTime(5 * time.Minute)
	return s, nil
}

// New returns a Store using the caller's database (opened with
// github.com/go-sql-driver/mysql with parseTime=true), which Close leaves
// open. [Store.Write] then signals this Store's relays when it inserts,
// before the caller commits: a relay that looks too early finds nothing
// and sees the messages at its next poll. [Open] does better.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("mysql: New needs a non-nil *sql.DB")
	}
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := newStore(db, opts)
	return s, nil
}

func newStore(db *sql.DB, opts Options) *Store {
	n := newNames(opts)
	return &Store{db: db, opts: opts, n: n, q: newQueries(n)}
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
	if s.dirty != nil {
		s.dirty.Close()
	}
	if s.ownDB {
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("mysql: close: %w", err)
		}
	}
	return nil
}

// check returns outbox.ErrClosed after Close.
func (s *Store) check(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("mysql: %s: %w", op, outbox.ErrClosed)
	}
	return nil
}

// wrap adds the operation to err and, when the tables are missing, says how
// to create them.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if missingTables(err) {
		return fmt.Errorf("mysql: %s: the outbox tables with prefix %q do not exist: run `outbox migrate --store <url>` (or Store.Migrate) first: %w",
			op, s.opts.TablePrefix, err)
	}
	return fmt.Errorf("mysql: %s: %w", op, err)
}

// missingTables reports whether err says a table does not exist (error
// 1146, ER_NO_SUCH_TABLE, on MySQL and MariaDB).
func missingTables(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}

// errNotMigrated reports an empty meta table.
var errNotMigrated = errors.New("the meta table has no partition count")

// queryer is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func readPartitions(ctx context.Context, q queryer, n names) (int, error) {
	var p int
	err := q.QueryRowContext(ctx, "SELECT partitions FROM "+n.meta+" WHERE singleton = 1").Scan(&p)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: run `outbox migrate --store <url>` (or Store.Migrate)", errNotMigrated)
	}
	return p, err
}

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

// inTx runs fn in a READ COMMITTED transaction (no gap locks: the store's
// own locking reads never hold back writers' inserts) and commits it, or
// rolls it back if fn or the commit fails. fn's error is returned as is.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// nullTime is t for a DATETIME column, NULL when zero.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

func fromNull(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// micros is d in whole microseconds, for INTERVAL … MICROSECOND.
func micros(d time.Duration) int64 { return d.Microseconds() }

// fileParams are the store URL parameters that name files.
type fileParams struct {
	passwordFile, ca, cert, key, serverName string
}

// takeFileParams removes the file parameters from q.
func takeFileParams(q url.Values) (fileParams, error) {
	var f fileParams
	for _, p := range []struct {
		name string
		dst  *string
	}{{"password_file", &f.passwordFile}, {"tls_ca", &f.ca}, {"tls_cert", &f.cert}, {"tls_key", &f.key}, {"tls_server_name", &f.serverName}} {
		if vs, ok := q[p.name]; ok {
			if len(vs) != 1 || vs[0] == "" {
				return f, fmt.Errorf("mysql: store URL parameter %s must be given once, with a value", p.name)
			}
			*p.dst = vs[0]
			q.Del(p.name)
		}
	}
	if (f.cert == "") != (f.key == "") {
		return f, errors.New("mysql: store URL parameters tls_cert and tls_key go together: give both, or neither")
	}
	return f, nil
}

// apply reads the files into cfg.
func (f fileParams) apply(cfg *mysql.Config) error {
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return fmt.Errorf("mysql: store URL parameter password_file: %w", err)
		}
		cfg.Passwd = strings.TrimRight(string(b), "\r\n")
	}
	if f.ca == "" && f.cert == "" && f.serverName == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		host = cfg.Addr
	}
	tc := &tls.Config{ServerName: cmp.Or(f.serverName, host), MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return fmt.Errorf("mysql: store URL parameter tls_ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return fmt.Errorf("mysql: store URL parameter tls_ca: %s holds no PEM certificate", f.ca)
		}
	}
	if f.cert != "" {
		c, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return fmt.Errorf("mysql: store URL parameters tls_cert and tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	cfg.TLS = tc
	return nil
}
