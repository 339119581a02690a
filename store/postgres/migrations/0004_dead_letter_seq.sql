-- 0004: a dead letter keeps the seq it had in the outbox, so that Requeue
-- puts the dead letters of a key back in the order they were written, not
-- in the order of created_at (the writers' clocks). Dead letters from
-- before this migration have none and go back after the others, by
-- created_at.
ALTER TABLE {{dead_letters}} ADD COLUMN IF NOT EXISTS seq bigint;
