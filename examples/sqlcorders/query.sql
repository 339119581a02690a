-- name: CreateOrder :one
INSERT INTO sqlc_orders (customer, total) VALUES ($1, $2)
RETURNING id, customer, status, total;

-- name: LockOrder :one
SELECT id, customer, status, total FROM sqlc_orders WHERE id = $1 FOR UPDATE;

-- name: SetStatus :one
UPDATE sqlc_orders SET status = $2 WHERE id = $1
RETURNING id, customer, status, total;
