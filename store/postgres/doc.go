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
// seeds' FOR UPDATE SKIP LOCKED claim), outbox.PartitionNotifier (LISTEN),
// outbox.Cleaner (retention) and outbox.AdminStore (status and dead
// letters). All expiry is judged by the database clock. Every
// method does one round of I/O and never retries: the relay retries.
//
// Settling is fenced: a settlement is applied only while its lease row still
// carries the relay's node and epoch, checked and locked FOR SHARE in the
// same statement, so a takeover waits for an in-flight settle and a former
// owner's late settle changes nothing (it gets *outbox.FencedError).
//
// # Capture modes
//
// Options.Capture chooses how messages travel from writers to the relay.
// With CaptureTable (the default, everything above) they are rows of
// <prefix>_messages. With CaptureWAL, [Writer.Write] emits each message
// into the WAL inside the application's transaction, as a transactional
// logical decoding message (pg_logical_emit_message with the prefix
// "outbox:<schema>.<prefix>", in one statement for any number of
// messages, encoded in a compact versioned binary form): no row is
// written, nothing is deleted or vacuumed. A [WALStore] streams them from a
// logical replication slot (pgoutput, protocol 1, a publication without
// tables, messages on): PostgreSQL sends each transaction whole, once it
// committed, in commit order, so Seq is commit order for every key,
// whether or not its writers are serialised. It needs PostgreSQL 14 or
// later, wal_level = logical, the REPLICATION attribute for the relay's
// user (not the writers'), and a free slot and WAL sender; [WALStore.Check]
// and Migrate say what to change. Migrate creates the publication and the
// slot; a slot sees only the transactions that commit after it exists.
//
// The position confirmed to PostgreSQL covers only transactions whose
// every message the broker acknowledged or the dead-letter table holds
// (dead letters are written first); a keepalive's position is taken only
// when nothing is pending, so an idle outbox in a busy database still
// advances its slot, and a graceful stop confirms everything settled.
//
// One process streams from the slot (PostgreSQL refuses a second); its
// relay holds the stream (outbox.StreamStore) and owns every partition, and
// the relays of other processes stand by, trying to take the slot every
// WALOptions.RetryInterval. After the holder is killed, its connection
// closes at once and a standby streams within about RetryInterval, and
// publishes at once (its Hold's channel says the slot was taken); after a network
// partition, within about WALOptions.Timeout + RetryInterval, the time
// PostgreSQL (wal_sender_timeout, set to Timeout on the connection) takes
// to drop the silent holder. A former holder cut off from the database can
// cause duplicates, never a reorder: the new holder starts from the
// confirmed position, which covers only messages acknowledged by the
// broker, and so publishes again every message the former holder may still
// publish; and each holder publishes a message of a key only after every
// earlier message of that key was acknowledged by the broker, so the first
// copy of each message reaches the broker after the first copy of every
// earlier message of its key, whichever holder sent them.
//
// A slot keeps the WAL its relay has not confirmed. A relay down for
// hours makes the server keep hours of WAL (Slot.LagBytes in the status);
// max_slot_wal_keep_size bounds that, and a slot over it is invalidated
// (wal_status = lost): the messages not confirmed are lost, which
// Check, the relay's rounds (Hold), the status and the metrics say loudly
// ([ErrSlotLost]), never a silent restart.
//
// # The xmin horizon
//
// With capture table every message is a row inserted, then deleted once
// published. While some transaction older than those rows is still open
// (a session idle in transaction, a long report, a prepared transaction,
// a standby with hot_standby_feedback through its slot), vacuum cannot
// remove the deleted rows, and the fetch, settle and lease statements
// walk over them: the relay slows down with every message written
// meanwhile. [Store.XminHorizon] says who holds the horizon (pid,
// application, state, transaction start; prepared transactions; every
// slot's xmin and catalog_xmin); it is in the status, and the relay's
// heartbeat logs a WARN naming the holder once it has held the horizon
// for Options.HorizonWarnAfter. Capture wal writes no row and is not
// slowed down.
//
// # The ring layout
//
// With Options.Layout [LayoutRing] (opt-in, applied by Migrate, online
// for an existing table) the outbox table is LIST-partitioned into a ring
// of Options.RingChildren children; writers (unchanged) insert into the
// current one, named by a sequence, and the relay moves them on every
// Options.RingRotate and TRUNCATEs each other child once every message in
// it is delivered. TRUNCATE leaves no dead row, whatever holds the
// horizon, so the rows the relay's statements walk over are those of the
// last few seconds. A child is truncated only while held in ACCESS
// EXCLUSIVE mode and found, after the lock, to hold no undelivered row:
// a transaction that inserted into it and commits late keeps it (see
// ring.go). Every guarantee above holds on it; the conformance suite, the
// chaos and crash tests run on both layouts. Settles name the child of
// each message (ringsettle.go), so each touches one child's unique index.
// A new outbox gets [LayoutNew] (plain) unless Options.Layout says
// otherwise; Migrate never converts a ring back (README: what to do
// instead).
//
// # Retention
//
// By default acknowledged messages are deleted at once. With
// Options.Retention > 0 they are marked published and kept that long; the
// relay calls [Store.Cleanup] periodically to delete them in batches.
package postgres
