-- 0002: search the dead letters by key and by topic, in listing order
-- (failed_at, id), for the console's filters and paging.
CREATE INDEX IF NOT EXISTS {{dead_key_idx}} ON {{dead_letters}} (key, failed_at, id);
CREATE INDEX IF NOT EXISTS {{dead_topic_idx}} ON {{dead_letters}} (topic, failed_at, id);
