// Package bunorders shows the outbox with bun (github.com/uptrace/bun,
// dialect pgdialect, on pgx's database/sql driver).
//
// bun's transaction type, bun.Tx, embeds the *sql.Tx it runs on: inside
// db.RunInTx, postgres.Writer.WriteSQL(ctx, tx.Tx, …) writes the messages
// in it, so they commit or roll back with the rows bun writes.
//
// Write mode: the default. Both functions serialise a key's writers
// before they write its message: PlaceOrder writes a new key, and
// ChangeStatus locks the order's row (SELECT … FOR UPDATE) before its
// Write, so a key's messages are written in commit order without key
// locks (TestStatusChangesPublishInCommitOrder).
package bunorders

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"

	"github.com/uptrace/bun"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Order is an order, a bun model.
type Order struct {
	bun.BaseModel `bun:"table:bun_orders"`

	ID       int64  `bun:"id,pk,autoincrement" json:"id"`
	Customer string `bun:"customer,notnull" json:"customer"`
	Status   string `bun:"status,notnull" json:"status"`
	Total    int64  `bun:"total,notnull" json:"total"`
}

func message(topic string, o *Order) (outbox.Message, error) {
	payload, err := json.Marshal(o)
	return outbox.Message{Topic: topic, Key: strconv.FormatInt(o.ID, 10), Payload: payload}, err
}

// PlaceOrder inserts an order and writes its "orders.created" message in
// one transaction.
func PlaceOrder(ctx context.Context, db *bun.DB, w *postgres.Writer, customer string, total int64) (*Order, error) {
	o := &Order{Customer: customer, Status: "placed", Total: total}
	err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(o).Returning("id").Exec(ctx); err != nil {
			return err
		}
		msg, err := message("orders.created", o)
		if err != nil {
			return err
		}
		return w.WriteSQL(ctx, tx.Tx, msg)
	})
	return o, err
}

// ChangeStatus locks the order's row, sets its status and writes an
// "orders.status_changed" message, in one transaction. afterLock, if not
// nil, runs once the row is locked (the tests use it to interleave
// transactions).
func ChangeStatus(ctx context.Context, db *bun.DB, w *postgres.Writer, id int64, status string, afterLock func()) error {
	return db.RunInTx(ctx, &sql.TxOptions{}, func(ctx context.Context, tx bun.Tx) error {
		o := &Order{ID: id}
		if err := tx.NewSelect().Model(o).WherePK().For("UPDATE").Scan(ctx); err != nil {
			return err
		}
		if afterLock != nil {
			afterLock()
		}
		o.Status = status
		if _, err := tx.NewUpdate().Model(o).Column("status").WherePK().Exec(ctx); err != nil {
			return err
		}
		msg, err := message("orders.status_changed", o)
		if err != nil {
			return err
		}
		return w.WriteSQL(ctx, tx.Tx, msg)
	})
}
