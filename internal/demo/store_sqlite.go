package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxrelay/outbox"
	sqliteinbox "github.com/outboxrelay/outbox/inbox/sqlite"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// sqliteSchema is the order service's own tables. WITHOUT ROWID keeps
// each row in its primary key's b-tree: placing an order writes one page
// of demo_orders instead of a table page and an index page, and every page
// a transaction writes is written to the WAL (and later checkpointed)
// while the other writers wait.
const sqliteSchema = `
CREATE TABLE demo_customers (
    id  TEXT PRIMARY KEY,
    seq INTEGER NOT NULL          -- the customer's last event sequence number
) STRICT, WITHOUT ROWID;
CREATE TABLE demo_orders (
    id         TEXT PRIMARY KEY,
    customer   TEXT NOT NULL,
    amount     INTEGER NOT NULL,
    stage      INTEGER NOT NULL,  -- set by the producer to 0, advanced by the consumer
    created_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
`

// sqliteOrders keeps everything in one SQLite file in a temporary
// directory.
type sqliteOrders struct {
	dir string
	s   *sqlite.Store
	db  *sql.DB
	in  *sqliteinbox.Inbox // the consumer's processed message IDs
	log *slog.Logger
	// The statements run for every order and batch, prepared once: SQLite
	// parsing them inside each write transaction made it longer, and every
	// other writer waits for it.
	bumpSeq, insertOrder, advance *sql.Stmt
}

func openSQLite(ctx context.Context, log *slog.Logger) (*sqliteOrders, string, error) {
	dir, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		return nil, "", fmt.Errorf("demo: create a temporary directory for the SQLite store: %w", err)
	}
	path := filepath.Join(dir, "demo.db")
	s, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	o := &sqliteOrders{dir: dir, s: s, db: s.DB(), log: log}
	if err := s.Migrate(ctx); err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	if _, err := o.db.ExecContext(ctx, sqliteSchema); err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: create the order tables: %w", err)
	}
	if o.in, err = sqliteinbox.New(o.db, sqliteinbox.Options{TablePrefix: "demo"}); err == nil {
		err = o.in.Migrate(ctx)
	}
	if err != nil {
		o.close()
		return nil, "", fmt.Errorf("demo: create the inbox: %w", err)
	}
	for _, p := range []struct {
		st    **sql.Stmt
		query string
	}{
		{&o.bumpSeq, `INSERT INTO demo_customers (id, seq) VALUES (?, ?)
ON CONFLICT (id) DO UPDATE SET seq = seq + excluded.seq RETURNING seq`},
		{&o.insertOrder, `INSERT INTO demo_orders (id, customer, amount, stage, created_at) VALUES (?, ?, ?, 0, ?)`},
		{&o.advance, `UPDATE demo_orders SET stage = max(stage, ?) WHERE id = ?`},
	} {
		if *p.st, err = o.db.PrepareContext(ctx, p.query); err != nil {
			o.close()
			return nil, "", fmt.Errorf("demo: prepare the order statements: %w", err)
		}
	}
	return o, "SQLite (embedded, " + path + ")", nil
}

func (o *sqliteOrders) store() outbox.Store { return o.s }

func (o *sqliteOrders) placeOrder(ctx context.Context, ord order) (err error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	var last int64
	if err := tx.StmtContext(ctx, o.bumpSeq).QueryRowContext(ctx, ord.Customer, eventsPerOrder).Scan(&last); err != nil {
		return err
	}
	if _, err := tx.StmtContext(ctx, o.insertOrder).ExecContext(ctx, ord.ID, ord.Customer, ord.Amount, time.Now().UnixNano()); err != nil {
		return err
	}
	msgs, err := orderMessages(ord, last)
	if err != nil {
		return err
	}
	if err := o.s.Write(ctx, tx, msgs...); err != nil {
		return err
	}
	return tx.Commit()
}

func (o *sqliteOrders) apply(ctx context.Context, evs []event) (fresh map[string]bool, err error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	// The inbox records the IDs in this transaction: the effects below
	// and the record commit together, so a redelivery is dropped.
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.id
	}
	flags, err := o.in.Record(ctx, tx, demoConsumer, ids)
	if err != nil {
		return nil, err
	}
	fresh = make(map[string]bool, len(evs))
	for i, f := range flags {
		if f {
			fresh[ids[i]] = true
		}
	}
	stmt := tx.StmtContext(ctx, o.advance)
	for id, stage := range maxStages(evs, fresh) {
		res, err := stmt.ExecContext(ctx, stage, id)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return nil, err
		} else if n != 1 {
			return nil, fmt.Errorf("an event names order %s, which does not exist", id)
		}
	}
	return fresh, tx.Commit()
}

func (o *sqliteOrders) close() {
	for _, st := range []*sql.Stmt{o.bumpSeq, o.insertOrder, o.advance} {
		if st != nil {
			st.Close()
		}
	}
	if err := o.s.Close(); err != nil {
		o.log.Warn("demo: close the SQLite store", "err", err)
	}
	if err := os.RemoveAll(o.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		o.log.Warn("demo: remove the temporary directory", "dir", o.dir, "err", err)
	}
}
