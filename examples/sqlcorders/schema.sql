CREATE TABLE sqlc_orders (
    id       bigserial PRIMARY KEY,
    customer text   NOT NULL,
    status   text   NOT NULL DEFAULT 'placed',
    total    bigint NOT NULL
);
