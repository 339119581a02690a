-- outbox:no-transaction
-- 0005: search the dead letters by key, in listing order (failed_at, id),
-- for the console's filters and paging. Dead letters are off the write
-- path, so the index costs the relay nothing per message; CONCURRENTLY
-- keeps a large dead-letter table writable (the relay's settles insert
-- into it) while the index is built.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{dead_key_idx}} ON {{dead_letters}} (key, failed_at, id)
