-- 0005: search the dead letters by key and by topic, in listing order
-- (failed_at, id), for the console's filters and paging. Dead letters are
-- off the write path, so these indexes cost the relay nothing per message.
CREATE INDEX IF NOT EXISTS {{dead_key_idx}} ON {{dead_letters}} (key, failed_at, id);
CREATE INDEX IF NOT EXISTS {{dead_topic_idx}} ON {{dead_letters}} (topic, failed_at, id);
