// Package sqlite is the embedded outbox store: an SQLite database through
// modernc.org/sqlite, a pure-Go driver (no cgo), so that an application, or
// `outbox demo`, needs no database server.
//
// The application writes messages with [Store.Write] (or the package-level
// [Write]) in its own *sql.Tx; the relay drains them through the [Store],
// which implements outbox.Store, outbox.UnorderedStore,
// outbox.PartitionNotifier, outbox.Cleaner and outbox.AdminStore (status
// and dead letters).
//
//	s, err := sqlite.Open(ctx, "app.db", sqlite.Options{})
//	…
//	err = s.Migrate(ctx)
//	tx, err := s.DB().BeginTx(ctx, nil)
//	… the application's own writes in tx …
//	err = s.Write(ctx, tx, outbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//	err = tx.Commit()
//
// # Guarantees
//
//   - Atomic with the business write: a message exists iff tx committed.
//   - Commit order: SQLite runs one write transaction at a time and seq is
//     an AUTOINCREMENT rowid, so seq order is commit order and the relay
//     publishes each key's messages in the order their transactions
//     committed.
//   - Fenced settlement: Settle checks, in its own write transaction, that
//     the relay node still holds the partition's lease with the same epoch.
//
// # Tables
//
// Options.TablePrefix (default "outbox") names <prefix>_messages,
// <prefix>_dead_letters, <prefix>_leases, <prefix>_relays, <prefix>_meta and
// <prefix>_migrations, the same layout as the PostgreSQL store. Times are
// INTEGER Unix nanoseconds by the store's clock (Options.Now).
//
// # Limits
//
//   - One writing process. SQLite serialises writers on a file lock, and
//     busy_timeout (Options.BusyTimeout) lets writers of other processes
//     wait, but the in-process FIFO write queue and the notifications only
//     work inside the process that opened the database with [Open]. Use the
//     PostgreSQL store for several writing processes.
//   - One relay process, with any number of workers, and any number of relay
//     nodes inside it. Leases and heartbeats use the store's clock, which
//     nodes in one process share. Ordering "none" claims are exclusive only
//     within one *Store (see [Store.ClaimUnordered]).
//   - Write throughput is bounded by one writer at a time: with WAL and
//     synchronous=NORMAL a small transaction takes well under a
//     millisecond, so thousands of transactions per second (the
//     application's, the relay's settlements and the consumer's together),
//     fewer with large payloads. Tests under -race are much slower: the
//     driver is C translated to Go, and every memory access is checked.
//   - A database on a network file system is not supported (SQLite's WAL
//     needs shared memory on one host).
//   - Payloads up to Options.MaxPayload (default 1 MiB, at most
//     [MaxPayloadLimit]); at most 32766 bound parameters per statement,
//     which Write respects by splitting large batches.
package sqlite
