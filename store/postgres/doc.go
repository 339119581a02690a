// Package postgres is the PostgreSQL outbox store, built on pgx v5.
//
// # Writing
//
// Applications write messages inside their own transaction with [Write]
// (pgx.Tx) or [WriteSQL] (database/sql on the pgx stdlib driver), or a
// [Writer] built with non-default [Options]. A write is one INSERT … SELECT
// FROM unnest(…) statement for any number of messages, plus a NOTIFY that
// PostgreSQL delivers on commit, naming the partitions written (or "*",
// any partition, when the list would not fit in a NOTIFY payload: a write
// never fails because of its wake-up). Messages exist if and only if the
// transaction commits.
//
// # Order
//
// A key's messages are published in the order of their sequence numbers,
// drawn when Write inserts them. By default that is insert order, which is
// commit order when the key's writers are serialised before they write
// (they update the key's aggregate row first, say). With
// Options.KeyLocks, Write takes an advisory lock per key (per group of
// keys for writes of more than 256 keys), held until the transaction ends,
// before drawing the numbers: publish order is then commit order whatever
// the application's own lock order, at the cost of writers of one key
// waiting for each other's commit, and of deadlocks (SQLSTATE 40P01) with
// transactions that lock an application row before Write while others
// lock it after. See [Writer.Write].
//
// The relay needs the primary: its marks are snapshots, and a hot
// standby's do not show the primary's transactions in progress. On a
// standby Partitions, and so the relay's Start, fails with [ErrStandby].
//
// # Tables
//
// [Store.Migrate] creates, in Options.Schema, the tables <prefix>_messages,
// <prefix>_dead_letters, <prefix>_leases (one row per partition),
// <prefix>_relays, <prefix>_meta (the partition count P) and
// <prefix>_migrations (applied versions), from embedded, versioned SQL files
// (migrations/NNNN_name.sql), in one transaction under an advisory lock.
// Schema and prefix are validated and quoted; every value is a bound
// parameter. Only two narrow partial indexes exist on the messages besides
// the primary key: (partition, seq) of pending records, and published_at of
// records kept for retention.
//
// # Relaying
//
// [Store] implements outbox.Store (partition leases with epochs, fetching per
// partition in seq order, fenced settling), outbox.MarkedFetcher (a fetch
// that also returns rows committed late below a cursor, found through the
// inserting transaction's ID and the previous fetch's snapshot),
// outbox.UnorderedStore (the
// seeds' FOR UPDATE SKIP LOCKED claim), outbox.Notifier (LISTEN),
// outbox.Cleaner (retention), outbox.StatusReader and
// outbox.DeadLetterStore. All expiry is judged by the database clock. Every
// method does one round of I/O and never retries: the relay retries.
//
// Settling is fenced: a settlement is applied only while its lease row still
// carries the relay's node and epoch, checked and locked FOR SHARE in the
// same statement, so a takeover waits for an in-flight settle and a former
// owner's late settle changes nothing (it gets *outbox.FencedError).
//
// # Retention
//
// By default acknowledged messages are deleted at once. With
// Options.Retention > 0 they are marked published and kept that long; the
// relay calls [Store.Cleanup] periodically to delete them in batches.
package postgres
