-- 0001: the outbox tables. Placeholders in double braces are replaced by
-- quoted, validated identifiers before this file runs; values are bound
-- parameters elsewhere, never pasted. Times are DATETIME(6) in UTC.
-- Statements end with a semicolon at the end of a line; each runs alone
-- (MySQL commits DDL at once, so every statement may be run again).

-- One row: the partition count P, fixed when the tables are created.
CREATE TABLE IF NOT EXISTS {{meta}} (
    singleton  TINYINT NOT NULL PRIMARY KEY,
    partitions INT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    CHECK (singleton = 1),
    CHECK (partitions > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- seq is drawn from AUTO_INCREMENT at insert; a row becomes visible at
-- commit, so a lower seq can appear after higher ones were read: the
-- relay's sweep below its cursors finds such late commits (doc.go, "Commit
-- order"). The clustered index is seq: inserts append.
CREATE TABLE IF NOT EXISTS {{messages}} (
    seq             BIGINT NOT NULL AUTO_INCREMENT,
    id              CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    part            INT NOT NULL,
    topic           VARBINARY(255) NOT NULL,
    msg_key         VARBINARY(1024) NOT NULL DEFAULT '',
    payload         LONGBLOB NOT NULL,
    headers         MEDIUMTEXT,
    created_at      DATETIME(6) NOT NULL,
    attempts        INT NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6) NULL,
    last_error      TEXT NULL,
    published_at    DATETIME(6) NULL,
    PRIMARY KEY (seq),
    -- Not UNIQUE on purpose: InnoDB fills a unique index before the
    -- others, and its duplicate check can wait for a lock held by a
    -- settle; the row would then sit in the clustered index with its seq
    -- drawn but absent from pending_idx, where Fetch looks for the seqs of
    -- open transactions (fetch.go, holdBack). IDs are UUIDv7 drawn by
    -- Write; writing one ID twice makes two rows.
    KEY id_idx (id),
    -- Fetch, Unsettled, status: pending records per partition in seq
    -- order (published_at IS NULL is an equality on the index). Narrow on
    -- purpose: no payload.
    KEY pending_idx (part, published_at, seq),
    -- Retention cleanup.
    KEY published_idx (published_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- seq is the message's seq when it died: Requeue puts dead letters back in
-- that order.
CREATE TABLE IF NOT EXISTS {{dead_letters}} (
    id         CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    seq        BIGINT NOT NULL,
    part       INT NOT NULL,
    topic      VARBINARY(255) NOT NULL,
    msg_key    VARBINARY(1024) NOT NULL DEFAULT '',
    payload    LONGBLOB NOT NULL,
    headers    MEDIUMTEXT,
    created_at DATETIME(6) NOT NULL,
    attempts   INT NOT NULL,
    last_error TEXT NOT NULL,
    failed_at  DATETIME(6) NOT NULL,
    KEY failed_idx (failed_at, id),
    KEY key_idx (msg_key, failed_at, id),
    KEY topic_idx (topic, failed_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per partition, created with the meta row. epoch increases every
-- time the partition changes hands and fences off former owners.
CREATE TABLE IF NOT EXISTS {{leases}} (
    part       INT NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{relays}} (
    node       VARCHAR(255) NOT NULL PRIMARY KEY,
    expires_at DATETIME(6) NOT NULL,
    started_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
