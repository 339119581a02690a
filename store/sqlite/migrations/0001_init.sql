-- 0001: the outbox tables. Placeholders in double braces are replaced by
-- quoted, validated identifiers before this file runs; values are bound
-- parameters elsewhere, never pasted. Times are INTEGER Unix nanoseconds
-- by the store's clock (Options.Now).

-- One row: the partition count P, fixed when the tables are created.
CREATE TABLE {{meta}} (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    partitions INTEGER NOT NULL CHECK (partitions > 0),
    created_at INTEGER NOT NULL
) STRICT;

-- seq is the rowid. AUTOINCREMENT makes it never reuse the seq of a deleted
-- row, and since SQLite serialises write transactions, seq order is commit
-- order.
CREATE TABLE {{messages}} (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,         -- UUIDv7, time-ordered
    partition       INTEGER NOT NULL,
    topic           TEXT NOT NULL,
    key             TEXT NOT NULL DEFAULT '',
    payload         BLOB NOT NULL,
    headers         TEXT,                         -- JSON; NULL when there are none
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_error      TEXT,
    published_at    INTEGER                       -- set only with retention
) STRICT;

-- Fetch, Unsettled and status read pending records per partition in seq
-- order. Narrow on purpose: no payload in any index.
CREATE INDEX {{pending_idx}} ON {{messages}} (partition, seq) WHERE published_at IS NULL;

-- Retention cleanup; empty unless Options.Retention > 0.
CREATE INDEX {{published_idx}} ON {{messages}} (published_at) WHERE published_at IS NOT NULL;

-- seq is the message's seq when it died: Requeue puts dead letters back in
-- that order.
CREATE TABLE {{dead_letters}} (
    id         TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL,
    partition  INTEGER NOT NULL,
    topic      TEXT NOT NULL,
    key        TEXT NOT NULL DEFAULT '',
    payload    BLOB NOT NULL,
    headers    TEXT,
    created_at INTEGER NOT NULL,
    attempts   INTEGER NOT NULL,
    last_error TEXT NOT NULL DEFAULT '',
    failed_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX {{failed_idx}} ON {{dead_letters}} (failed_at);

-- One row per partition, created with the meta row. epoch increases every
-- time the partition changes hands and fences off former owners.
CREATE TABLE {{leases}} (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER
) STRICT;

CREATE TABLE {{relays}} (
    node       TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL,
    started_at INTEGER NOT NULL
) STRICT;
