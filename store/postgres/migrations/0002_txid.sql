-- 0002: the inserting transaction's ID on every message, for FetchMarked.
-- A sequence hands out seq when a row is inserted, not when its
-- transaction commits, so a row can become visible below a relay's cursor.
-- FetchMarked returns such rows by testing txid against the snapshot of
-- the previous fetch (pg_visible_in_snapshot).
ALTER TABLE {{messages}} ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT pg_current_xact_id();
