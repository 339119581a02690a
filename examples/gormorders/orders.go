// Package gormorders shows the outbox with GORM (gorm.io/gorm and
// gorm.io/driver/postgres, which runs on pgx's database/sql driver).
//
// GORM runs a transaction's statements on a *sql.Tx: inside
// db.Transaction, tx.Statement.ConnPool is that *sql.Tx, and
// postgres.Writer.WriteSQL (or postgres.WriteSQL for the default tables)
// writes the messages in it, so they commit or roll back with the rows
// GORM writes.
//
// PlaceOrder locks nothing before it writes, but each order is a new key:
// the default write mode keeps a key's commit order. RecordPayment writes
// its message from an AfterCreate hook, as GORM applications often do, and
// so before it updates the order's row: this is the pattern the outbox's
// default write mode cannot order (two payments of one order may commit
// in the other order than they wrote). It needs a Writer with key locks
// (postgres.Options{KeyLocks: new(true)}) or the WAL capture mode
// (Options.Capture = postgres.CaptureWAL); see TestPaymentsPublishInCommitOrder.
package gormorders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"gorm.io/gorm"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Order is an order, a GORM model.
type Order struct {
	ID       int64 `gorm:"primaryKey"`
	Customer string
	Status   string
	Paid     int64
	Total    int64
}

// Payment is a payment of an order. Its AfterCreate hook writes the
// "payments.recorded" message, keyed by the order, in the transaction that
// creates it.
type Payment struct {
	ID      int64 `gorm:"primaryKey"`
	OrderID int64
	Amount  int64
}

// ctxWriter is the context key of the outbox Writer the hooks use.
type ctxWriter struct{}

// WithWriter returns ctx carrying w for the models' hooks.
func WithWriter(ctx context.Context, w *postgres.Writer) context.Context {
	return context.WithValue(ctx, ctxWriter{}, w)
}

// sqlTx returns the *sql.Tx of a GORM transaction.
func sqlTx(tx *gorm.DB) (*sql.Tx, error) {
	t, ok := tx.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("gormorders: not in a transaction (ConnPool is %T): write messages inside db.Transaction", tx.Statement.ConnPool)
	}
	return t, nil
}

// write writes msg in the GORM transaction tx with the Writer of ctx.
func write(tx *gorm.DB, msg outbox.Message) error {
	ctx := tx.Statement.Context
	w, ok := ctx.Value(ctxWriter{}).(*postgres.Writer)
	if !ok {
		return errors.New("gormorders: no outbox Writer in the context: use WithWriter")
	}
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	return w.WriteSQL(ctx, t, msg)
}

// AfterCreate writes the payment's message in the creating transaction.
func (p *Payment) AfterCreate(tx *gorm.DB) error {
	payload, err := json.Marshal(map[string]int64{"order": p.OrderID, "payment": p.ID, "amount": p.Amount})
	if err != nil {
		return err
	}
	return write(tx, outbox.Message{Topic: "payments.recorded", Key: strconv.FormatInt(p.OrderID, 10), Payload: payload})
}

// PlaceOrder creates an order and its "orders.created" message in one
// transaction. ctx must carry a Writer (WithWriter).
func PlaceOrder(ctx context.Context, db *gorm.DB, customer string, total int64) (Order, error) {
	o := Order{Customer: customer, Status: "placed", Total: total}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		return write(tx, outbox.Message{Topic: "orders.created", Key: strconv.FormatInt(o.ID, 10), Payload: payload})
	})
	return o, err
}

// RecordPayment creates a payment (whose hook writes its message) and then
// adds it to the order, in one transaction: the message is written before
// the order's row is locked. beforeUpdate, if not nil, runs between the
// two (the tests use it to interleave transactions).
func RecordPayment(ctx context.Context, db *gorm.DB, orderID, amount int64, beforeUpdate func()) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Payment{OrderID: orderID, Amount: amount}).Error; err != nil {
			return err
		}
		if beforeUpdate != nil {
			beforeUpdate()
		}
		return tx.Model(&Order{ID: orderID}).Updates(map[string]any{
			"paid":   gorm.Expr("paid + ?", amount),
			"status": "paid",
		}).Error
	})
}
