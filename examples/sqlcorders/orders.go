// Package sqlcorders shows the outbox with sqlc (sql_package pgx/v5): the
// queries in ./db take any DBTX, so db.New(tx) runs them in a pgx.Tx, and
// postgres.Writer.Write writes the messages in that same pgx.Tx.
//
// Write mode: the default. ChangeStatus locks the order's row (LockOrder:
// SELECT … FOR UPDATE) before its Write, so a key's messages are written
// in commit order without key locks.
package sqlcorders

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/examples/sqlcorders/db"
	"github.com/outboxrelay/outbox/store/postgres"
)

func message(topic string, o db.SqlcOrder) (outbox.Message, error) {
	payload, err := json.Marshal(o)
	return outbox.Message{Topic: topic, Key: strconv.FormatInt(o.ID, 10), Payload: payload}, err
}

// PlaceOrder inserts an order and writes its "orders.created" message in
// one transaction.
func PlaceOrder(ctx context.Context, pool *pgxpool.Pool, w *postgres.Writer, customer string, total int64) (db.SqlcOrder, error) {
	var o db.SqlcOrder
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if o, err = db.New(tx).CreateOrder(ctx, db.CreateOrderParams{Customer: customer, Total: total}); err != nil {
			return err
		}
		msg, err := message("orders.created", o)
		if err != nil {
			return err
		}
		return w.Write(ctx, tx, msg)
	})
	return o, err
}

// ChangeStatus locks the order's row, sets its status and writes an
// "orders.status_changed" message, in one transaction. afterLock, if not
// nil, runs once the row is locked (the tests use it to interleave
// transactions).
func ChangeStatus(ctx context.Context, pool *pgxpool.Pool, w *postgres.Writer, id int64, status string, afterLock func()) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if _, err := q.LockOrder(ctx, id); err != nil {
			return err
		}
		if afterLock != nil {
			afterLock()
		}
		o, err := q.SetStatus(ctx, db.SetStatusParams{ID: id, Status: status})
		if err != nil {
			return err
		}
		msg, err := message("orders.status_changed", o)
		if err != nil {
			return err
		}
		return w.Write(ctx, tx, msg)
	})
}
