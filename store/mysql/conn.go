package mysql

import (
	"context"
	"database/sql/driver"
	"errors"
)

// The in-process notification of commits. MySQL has no LISTEN/NOTIFY: a
// database opened by Open wraps the driver's connections so that the commit
// of a transaction in which Store.Write ran wakes the relays subscribed to
// that Store, with the partitions written, once the rows are visible. Writes
// by other processes are found by the relay's polling.

// writeKey is the context key under which Write passes the partitions of
// its INSERT to the connection that runs it.
type writeKey struct{}

// connector wraps the driver's connector.
type connector struct {
	base   driver.Connector
	notify func(parts []int)
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn_{Conn: conn, notify: c.notify}, nil
}

func (c *connector) Driver() driver.Driver { return c.base.Driver() }

// conn_ is a driver connection that remembers the partitions written by
// Store.Write in its open transaction. database/sql uses a connection from
// one goroutine at a time.
type conn_ struct {
	driver.Conn
	notify func(parts []int)
	inTx   bool
	parts  []int
	any    bool
}

func (c *conn_) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.inTx, c.parts, c.any = true, c.parts[:0], false
	return &tx_{Tx: tx, c: c}, nil
}

func (c *conn_) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	if errors.Is(err, driver.ErrSkip) {
		// Without interpolateParams: prepare, run, close here, so that the
		// write is recorded like any other.
		var st driver.Stmt
		st, err = c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
		if err != nil {
			return nil, err
		}
		res, err = st.(driver.StmtExecContext).ExecContext(ctx, args)
		st.Close()
	}
	if err == nil && c.inTx {
		if parts, ok := ctx.Value(writeKey{}).([]int); ok {
			if parts == nil {
				c.any = true
			}
			c.parts = append(c.parts, parts...)
		}
	}
	return res, err
}

func (c *conn_) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *conn_) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *conn_) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c *conn_) ResetSession(ctx context.Context) error {
	c.inTx, c.parts, c.any = false, c.parts[:0], false
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *conn_) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c *conn_) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// tx_ notifies the partitions written once its commit succeeded.
type tx_ struct {
	driver.Tx
	c *conn_
}

func (t *tx_) Commit() error {
	err := t.Tx.Commit()
	c := t.c
	parts, anyPart := c.parts, c.any
	c.inTx, c.parts, c.any = false, c.parts[:0], false
	if err == nil && (anyPart || len(parts) > 0) {
		if anyPart {
			c.notify(nil)
		} else {
			c.notify(dedup(parts))
		}
	}
	return err
}

func (t *tx_) Rollback() error {
	t.c.inTx, t.c.parts, t.c.any = false, t.c.parts[:0], false
	return t.Tx.Rollback()
}

// dedup returns parts without repeats, in a new slice.
func dedup(parts []int) []int {
	seen := make(map[int]struct{}, len(parts))
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		if _, ok := seen[p]; !ok {
			seen[p] = struct{}{}
			out = append(out, p)
		}
	}
	return out
}
