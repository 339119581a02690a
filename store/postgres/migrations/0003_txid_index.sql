-- outbox:no-transaction
-- 0003: find late commits by transaction ID. FetchMarked looks up, per
-- partition, the rows of the transactions that were in progress at the
-- previous fetch (and of later ones), instead of scanning every row below
-- the relay's cursor, deleted rows not yet vacuumed included.
-- The table may already hold many rows when this runs: CONCURRENTLY builds
-- the index without blocking writers, outside a transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{txid_idx}} ON {{messages}} (partition, txid) WHERE published_at IS NULL
