-- 0001: the outbox tables. Placeholders in double braces are replaced by
-- quoted, validated identifiers before this file runs; values are bound
-- parameters elsewhere, never pasted.

-- One row: the partition count P, fixed when the tables are created.
CREATE TABLE {{meta}} (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions integer NOT NULL CHECK (partitions > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{messages}} (
    id              uuid PRIMARY KEY,            -- UUIDv7, time-ordered
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    partition       integer NOT NULL,
    topic           text NOT NULL,
    key             text NOT NULL DEFAULT '',
    payload         bytea NOT NULL,
    headers         jsonb,                       -- NULL when there are none
    created_at      timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    published_at    timestamptz                  -- set only with retention
);

-- Fetch, Unsettled and status read pending records per partition in seq
-- order. Narrow on purpose: no payload in any index.
CREATE INDEX {{pending_idx}} ON {{messages}} (partition, seq) WHERE published_at IS NULL;

-- Retention cleanup; empty unless Options.Retention > 0.
CREATE INDEX {{published_idx}} ON {{messages}} (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE {{dead_letters}} (
    id         uuid PRIMARY KEY,
    partition  integer NOT NULL,
    topic      text NOT NULL,
    key        text NOT NULL DEFAULT '',
    payload    bytea NOT NULL,
    headers    jsonb,
    created_at timestamptz NOT NULL,
    attempts   integer NOT NULL,
    last_error text NOT NULL DEFAULT '',
    failed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{failed_idx}} ON {{dead_letters}} (failed_at);

-- One row per partition, created with the meta row. epoch increases every
-- time the partition changes hands and fences off former owners.
CREATE TABLE {{leases}} (
    partition  integer PRIMARY KEY,
    owner      text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz
);

CREATE TABLE {{relays}} (
    node       text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
