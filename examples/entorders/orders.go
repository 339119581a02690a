// Package entorders shows the outbox with ent (entgo.io/ent; the client
// in ./ent is generated from ./ent/schema by `go generate ./ent`).
//
// An ent transaction does not expose the *sql.Tx it runs on, so the
// example begins the *sql.Tx itself and runs an ent client over it
// (entsql.NewDriver with entsql.Conn{ExecQuerier: tx}, whose own
// transactions are no-ops: dialect.NopTx): postgres.Writer.WriteSQL writes the
// messages in the same transaction, and they commit or roll back with the
// rows ent writes.
//
// Write mode: the default. ChangeStatus updates the order's row (which
// locks it) before its Write, so a key's messages are written in commit
// order without key locks.
package entorders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strconv"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/examples/entorders/ent"
	"github.com/outboxrelay/outbox/store/postgres"
)

// InTx runs fn in a transaction of db with an ent client over it, and
// commits it if fn returns nil (else rolls it back).
func InTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx, client *ent.Client) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	client := ent.NewClient(ent.Driver(txDriver{entsql.NewDriver(dialect.Postgres, entsql.Conn{ExecQuerier: tx})}))
	if err := fn(tx, client); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// txDriver is an ent driver over an open *sql.Tx. The transactions ent
// starts itself (an update runs in one) are no-ops inside it.
type txDriver struct{ *entsql.Driver }

// Tx implements dialect.Driver.
func (d txDriver) Tx(context.Context) (dialect.Tx, error) { return dialect.NopTx(d.Driver), nil }

func message(topic string, o *ent.Order) (outbox.Message, error) {
	payload, err := json.Marshal(map[string]any{"id": o.ID, "customer": o.Customer, "status": o.Status, "total": o.Total})
	return outbox.Message{Topic: topic, Key: strconv.Itoa(o.ID), Payload: payload}, err
}

// PlaceOrder creates an order with ent and writes its "orders.created"
// message in the same transaction.
func PlaceOrder(ctx context.Context, db *sql.DB, w *postgres.Writer, customer string, total int64) (*ent.Order, error) {
	var o *ent.Order
	err := InTx(ctx, db, func(tx *sql.Tx, client *ent.Client) error {
		var err error
		if o, err = client.Order.Create().SetCustomer(customer).SetTotal(total).Save(ctx); err != nil {
			return err
		}
		msg, err := message("orders.created", o)
		if err != nil {
			return err
		}
		return w.WriteSQL(ctx, tx, msg)
	})
	return o, err
}

// ChangeStatus updates the order's status (locking its row) and then
// writes an "orders.status_changed" message, in one transaction.
// afterUpdate, if not nil, runs between the two (the tests use it to
// interleave transactions).
func ChangeStatus(ctx context.Context, db *sql.DB, w *postgres.Writer, id int, status string, afterUpdate func()) error {
	return InTx(ctx, db, func(tx *sql.Tx, client *ent.Client) error {
		o, err := client.Order.UpdateOneID(id).SetStatus(status).Save(ctx)
		if err != nil {
			return err
		}
		if afterUpdate != nil {
			afterUpdate()
		}
		msg, err := message("orders.status_changed", o)
		if err != nil {
			return err
		}
		return w.WriteSQL(ctx, tx, msg)
	})
}
