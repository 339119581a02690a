// Written as sqlc v1.31 generates it from ../query.sql (see db.go).

package db

import (
	"context"
)

const createOrder = `-- name: CreateOrder :one
INSERT INTO sqlc_orders (customer, total) VALUES ($1, $2)
RETURNING id, customer, status, total
`

type CreateOrderParams struct {
	Customer string
	Total    int64
}

func (q *Queries) CreateOrder(ctx context.Context, arg CreateOrderParams) (SqlcOrder, error) {
	row := q.db.QueryRow(ctx, createOrder, arg.Customer, arg.Total)
	var i SqlcOrder
	err := row.Scan(
		&i.ID,
		&i.Customer,
		&i.Status,
		&i.Total,
	)
	return i, err
}

const lockOrder = `-- name: LockOrder :one
SELECT id, customer, status, total FROM sqlc_orders WHERE id = $1 FOR UPDATE
`

func (q *Queries) LockOrder(ctx context.Context, id int64) (SqlcOrder, error) {
	row := q.db.QueryRow(ctx, lockOrder, id)
	var i SqlcOrder
	err := row.Scan(
		&i.ID,
		&i.Customer,
		&i.Status,
		&i.Total,
	)
	return i, err
}

const setStatus = `-- name: SetStatus :one
UPDATE sqlc_orders SET status = $2 WHERE id = $1
RETURNING id, customer, status, total
`

type SetStatusParams struct {
	ID     int64
	Status string
}

func (q *Queries) SetStatus(ctx context.Context, arg SetStatusParams) (SqlcOrder, error) {
	row := q.db.QueryRow(ctx, setStatus, arg.ID, arg.Status)
	var i SqlcOrder
	err := row.Scan(
		&i.ID,
		&i.Customer,
		&i.Status,
		&i.Total,
	)
	return i, err
}
