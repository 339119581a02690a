package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// writeMarker starts every INSERT made by Write. A connection of a database
// opened by Open recognises it, so that the commit of the transaction that
// ran it wakes subscribed relays (see [Store.Subscribe]).
const writeMarker = "/* outbox:write */ "

// gate serialises this process's write transactions on one database in
// FIFO order. SQLite allows one writer at a time; without the gate,
// writers that find the database locked sleep in SQLite's busy handler on a
// fixed schedule (up to 100 ms per retry), which gives long latency tails
// under load. With it they queue in Go and start as soon as the previous
// writer finishes. busy_timeout still covers writers of other processes.
type gate struct {
	ch   chan struct{}
	wait time.Duration // Options.BusyTimeout
}

func newGate(wait time.Duration) *gate {
	return &gate{ch: make(chan struct{}, 1), wait: wait}
}

// errGateTimeout is returned when a write transaction waited longer than
// Options.BusyTimeout for another one of this process.
var errGateTimeout = errors.New("database is locked")

// acquire waits for the write gate, at most g.wait and until ctx ends.
func (g *gate) acquire(ctx context.Context) error {
	select {
	case g.ch <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return fmt.Errorf("sqlite: another write transaction of this process held the write lock for more than %v (Options.BusyTimeout): %w", g.wait, errGateTimeout)
	}
}

func (g *gate) release() { <-g.ch }

// connector wraps the driver's connector for databases opened by Open: its
// connections pass write transactions through the gate, and report commits
// of transactions in which Write ran, with the partitions written (nil:
// unknown).
type connector struct {
	base   driver.Connector
	gate   *gate
	notify func(partitions []int)
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{base: dc, c: c}, nil
}

func (c *connector) Driver() driver.Driver { return c.base.Driver() }

// cacheMarker starts the store's own statements that run in every
// settlement. A connection of a database made by Open keeps each such text
// prepared (up to maxCachedStmts): SQLite parsed them in every settlement's
// write transaction, 44% of Settle's CPU at 250 orders/s in the demo.
const cacheMarker = "/* outbox:cached */ "

// maxCachedStmts bounds the statements one connection keeps prepared;
// texts beyond it (the IN lists of many sizes) are parsed each time.
const maxCachedStmts = 64

// cachedStmt is a statement a connection keeps prepared.
type cachedStmt struct {
	st   driver.Stmt
	busy bool // rows of it are open: run the text unprepared meanwhile
}

// conn wraps one driver connection. database/sql uses a connection from one
// goroutine at a time, so wrote, parts and stmts need no lock.
type conn struct {
	base  driver.Conn
	c     *connector
	wrote bool // Write ran in the current transaction
	// parts are the partitions Write inserted into in the current
	// transaction, read from the INSERT's arguments; nil after a Write
	// whose arguments it could not read: any partition.
	parts []int
	stmts map[string]*cachedStmt // by text, those starting with cacheMarker
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
)

// Unwrap returns the modernc.org/sqlite connection, for callers of
// sql.Conn.Raw that need its own methods (backup, hooks, ...).
func (c *conn) Unwrap() driver.Conn { return c.base }

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares query; a Write's INSERT is wrapped so that its
// executions are marked, with their arguments.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var st driver.Stmt
	var err error
	if p, ok := c.base.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.base.Prepare(query)
	}
	if err != nil || !strings.HasPrefix(query, writeMarker) {
		return st, err
	}
	ec, ok := st.(driver.StmtExecContext)
	if !ok {
		st.Close()
		return nil, errors.New("sqlite: driver statement does not implement ExecContext")
	}
	return &writeStmt{Stmt: st, exec: ec, conn: c, query: query}, nil
}

// writeStmt is a prepared INSERT of Write: executing it marks the
// connection's transaction as one that wrote, to those partitions.
type writeStmt struct {
	driver.Stmt
	exec  driver.StmtExecContext
	conn  *conn
	query string
}

func (s *writeStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.conn.mark(s.query, args)
	return s.exec.ExecContext(ctx, args)
}

func (s *writeStmt) Exec(args []driver.Value) (driver.Result, error) {
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return s.ExecContext(context.Background(), named)
}

func (c *conn) Close() error {
	for _, cs := range c.stmts {
		cs.st.Close()
	}
	clear(c.stmts)
	return c.base.Close()
}

// cached returns the prepared statement of query if query starts with
// cacheMarker and is not in use, preparing it on first use; nil otherwise
// (the caller runs query unprepared, which also reports its errors).
func (c *conn) cached(ctx context.Context, query string) *cachedStmt {
	if !strings.HasPrefix(query, cacheMarker) {
		return nil
	}
	if cs, ok := c.stmts[query]; ok {
		if cs.busy {
			return nil
		}
		return cs
	}
	p, ok := c.base.(driver.ConnPrepareContext)
	if !ok || len(c.stmts) >= maxCachedStmts {
		return nil
	}
	st, err := p.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	_, execs := st.(driver.StmtExecContext)
	_, queries := st.(driver.StmtQueryContext)
	if !execs || !queries {
		st.Close()
		return nil
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*cachedStmt)
	}
	cs := &cachedStmt{st: st}
	c.stmts[query] = cs
	return cs
}

// cachedRows frees its statement for the next use when closed.
type cachedRows struct {
	driver.Rows
	cs *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.cs.busy = false
	return err
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx passes transactions that may write through the gate; read-only
// ones (sql.TxOptions{ReadOnly: true}, a deferred BEGIN) do not wait.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := c.base.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("sqlite: driver connection does not implement BeginTx")
	}
	c.reset()
	if opts.ReadOnly {
		t, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return &tx{base: t, conn: c}, nil
	}
	if err := c.c.gate.acquire(ctx); err != nil {
		return nil, err
	}
	t, err := b.BeginTx(ctx, opts)
	if err != nil {
		c.c.gate.release()
		return nil, err
	}
	return &tx{base: t, conn: c, release: sync.OnceFunc(c.c.gate.release)}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.base.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.mark(query, args)
	if cs := c.cached(ctx, query); cs != nil {
		return cs.st.(driver.StmtExecContext).ExecContext(ctx, args)
	}
	return e.ExecContext(ctx, query, args)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.base.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if cs := c.cached(ctx, query); cs != nil {
		rows, err := cs.st.(driver.StmtQueryContext).QueryContext(ctx, args)
		if err != nil {
			return nil, err
		}
		cs.busy = true
		return &cachedRows{Rows: rows, cs: cs}, nil
	}
	return q.QueryContext(ctx, query, args)
}

func (c *conn) Ping(ctx context.Context) error {
	if p, ok := c.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *conn) ResetSession(ctx context.Context) error {
	c.reset()
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *conn) IsValid() bool {
	if v, ok := c.base.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// mark notes a Write's INSERT run with args, and the partitions of its
// rows (the second of every writeColumns arguments).
func (c *conn) mark(query string, args []driver.NamedValue) {
	if !strings.HasPrefix(query, writeMarker) {
		return
	}
	first := !c.wrote
	c.wrote = true
	if !first && c.parts == nil {
		return // already any partition
	}
	if len(args) == 0 || len(args)%writeColumns != 0 {
		c.parts = nil
		return
	}
	for i := 1; i < len(args); i += writeColumns {
		p, ok := args[i].Value.(int64)
		if !ok {
			c.parts = nil
			return
		}
		if n := len(c.parts); n == 0 || c.parts[n-1] != int(p) {
			c.parts = append(c.parts, int(p))
		}
	}
	if c.parts == nil {
		c.parts = []int{} // no rows: nothing to notify, but not "any"
	}
}

// reset forgets the Writes of the last transaction.
func (c *conn) reset() {
	c.wrote = false
	c.parts = c.parts[:0]
}

// tx releases the gate when it ends and, after a commit in which Write ran,
// wakes the store's subscribers: the messages are visible by then.
type tx struct {
	base    driver.Tx
	conn    *conn
	release func() // nil for read-only transactions
}

func (t *tx) Commit() error {
	err := t.base.Commit()
	t.end()
	if err == nil && t.conn.wrote && (t.conn.parts == nil || len(t.conn.parts) > 0) {
		var parts []int
		if t.conn.parts != nil {
			parts = slices.Clone(t.conn.parts)
		}
		t.conn.c.notify(parts)
	}
	t.conn.reset()
	return err
}

func (t *tx) Rollback() error {
	err := t.base.Rollback()
	t.end()
	t.conn.reset()
	return err
}

func (t *tx) end() {
	if t.release != nil {
		t.release()
	}
}
