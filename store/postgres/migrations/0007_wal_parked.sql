-- 0007: capture wal parks messages here. While the relay's buffer is full,
-- the messages it has held longer than WALOptions.ParkAfter (a blocked
-- destination's, a key waiting for its retries) move out of memory into
-- this table, so that the slot's position moves on and every other
-- destination goes on being captured. The relay reads them back with the
-- buffer's, in seq order, and deletes them once delivered. Empty, and never
-- read, in table capture.
CREATE TABLE IF NOT EXISTS {{parked}} (
    id              uuid PRIMARY KEY,
    seq             bigint NOT NULL,             -- the relay's order: commit order
    commit_lsn      bigint NOT NULL,             -- the transaction's commit position
    partition       integer NOT NULL,
    topic           text NOT NULL,
    key             text NOT NULL DEFAULT '',
    payload         bytea NOT NULL,
    headers         jsonb,
    created_at      timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    parked_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS {{parked_idx}} ON {{parked}} (partition, seq);
