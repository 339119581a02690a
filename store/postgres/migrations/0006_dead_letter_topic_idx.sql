-- outbox:no-transaction
-- 0006: search the dead letters by topic, in listing order (failed_at, id),
-- built like 0005 without blocking writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{dead_topic_idx}} ON {{dead_letters}} (topic, failed_at, id)
