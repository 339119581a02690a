// Package inbox makes message handling idempotent on the consumer side: a
// consumer records each message ID it has handled in its own database, in the
// same transaction as the handler's effect, and drops a message whose ID is
// already recorded.
//
// The relay delivers at least once: after a crash or a lost acknowledgement a
// message can arrive twice, and every copy carries the same ID (see
// outbox.Message.ID). The inbox turns that into "effect applied once".
//
// Implementations live in subpackages, each taking its own transaction type:
//
//   - inbox/postgres: PostgreSQL, with pgx (pgx.Tx) or database/sql (*sql.Tx);
//   - inbox/sqlite: SQLite through database/sql (*sql.Tx, modernc.org/sqlite);
//   - inbox/consume: helpers for NATS JetStream, RabbitMQ and Kafka consumers
//     that read the message ID, run the handler through an inbox and
//     acknowledge only after the commit;
//   - inbox/dynamodb: the DynamoDB tools of "Idempotency in DynamoDB":
//     optimistic concurrency and idempotent updates with a sliding window of
//     keys on the item, with a capacity calculator.
//
// Their throughput measurements (internal/inboxbench) are no part of the
// public API.
//
// # Guarantees
//
//   - At most once per (consumer, message ID) within the retention window:
//     Process runs the handler only if it records the pair, and the record
//     and the handler's effect commit together or not at all (the pair is
//     never marked before it is handled). A message redelivered after the
//     commit is dropped; one redelivered after a rollback runs again.
//   - Concurrent duplicates wait: the record is the first write of the
//     transaction, so a second delivery of the same ID blocks on the first
//     one's row until it commits (then it is a duplicate) or rolls back (then
//     it runs).
//   - Acknowledge after commit: the broker helpers acknowledge a message only
//     once its transaction has committed, so a crash in between causes a
//     redelivery, which the inbox drops.
//   - Bounded retention: records older than the retention window are deleted
//     in batches by Cleanup. A duplicate arriving after its record was
//     deleted runs again, so the window must outlast every redelivery (the
//     broker's maximum redelivery delay and the relay's longest retry).
//
// # Batches
//
// A consumer that handles a batch of messages in one transaction calls
// Record instead of Process: it records all the IDs in one statement and
// reports which are new, and the consumer applies the effects of those only,
// in the same transaction. Record sorts the IDs before inserting them, so
// that concurrent batches with overlapping IDs take their row locks in the
// same order and cannot deadlock on each other.
//
// # Results
//
// Process and Run return (processed bool, err error): (true, nil) when the
// handler ran and (for Run) committed, (false, nil) for a duplicate, whose
// handler was not called, and (false, err) when recording, the handler or the
// commit failed. After an error from Process the caller must roll back.
package inbox
