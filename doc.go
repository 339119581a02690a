// Package outbox implements the transactional outbox pattern: an
// application writes the messages it must send into its own database, in
// the same transaction as its state change, and a [Relay] drains them to a
// message broker.
//
// This package holds the portable parts and imports only the standard
// library: [Message], IDs ([NewID], UUIDv7), partitioning ([PartitionOf]),
// the [Store] and [Publisher] contracts, and the [Relay] with its [Config].
// Backends live in subpackages: store/postgres, store/sqlite,
// store/dynamodb; broker/natsjs, broker/rabbitmq, broker/kafka.
//
// # Atomic with the business write
//
// A store's Write function takes the caller's transaction (pgx.Tx,
// *sql.Tx, a DynamoDB TransactWriteItem): a message exists if and only if
// that transaction commits.
//
// # At least once
//
// A message leaves the outbox only after the broker acknowledged it (NATS
// PubAck, AMQP publisher confirm with no return, Kafka acks=all). A crash,
// a lost acknowledgement or a lost lease can publish a message again; every
// copy carries the same Message.ID, which brokers (NATS Nats-Msg-Id) and
// consumers (the inbox packages) use to drop duplicates.
//
// # Per-key order
//
// With [OrderingKey] (the default), messages with the same non-empty key are
// first published in the order their transactions committed, with any
// number of workers and relay processes, across retries and crashes. Keys
// map to P partitions ([PartitionOf], P fixed at migration); each partition
// has one owner at a time, a lease with an epoch held in the store. The
// owner publishes a partition's records in store order (Record.Seq), never
// has two messages of one key in flight, so a later message cannot reach
// the broker before the earlier one is acknowledged, and holds back the
// later messages of a key whose earlier message failed. A relay starts a
// publish only while its lease will outlive [Config.PublishTimeout], and
// every settlement is fenced by the epoch: a relay that lost its lease
// cannot change the outbox. Leases are shared fairly among live relays; a
// relay hands its surplus back only once nothing of those partitions is in
// flight or waiting to be settled, so a relay joining does not cause
// duplicates. Record.Seq is insert order; it equals commit
// order for one key whenever the writers of that key are serialised, as
// they are when they update the same aggregate row. A record can commit
// after records with a higher Seq were fetched (a PostgreSQL sequence hands
// out numbers at insert): stores that allow this return such records on
// the next fetch through a mark ([MarkedFetcher]: PostgreSQL uses the
// previous fetch's snapshot), ahead of any later record of their key; a
// periodic sweep below the cursors is the safety net for stores without
// marks. Messages without a key have no order.
//
// [OrderingNone] is the seeds' design: any worker claims any due records
// with FOR UPDATE SKIP LOCKED and holds the transaction across the broker
// call. No order.
//
// # No poison pill
//
// A failed message is retried with exponential backoff and jitter
// ([Backoff], Config.BackoffMin/Max) and after Config.MaxAttempts, or at
// once for a [PermanentError], moves to the dead letters with its last
// error and attempt count. It holds back only later messages of its own key;
// once its dead-lettering is written they go on.
//
// # Bounded everything
//
// Batch size, records held in memory per partition (FetchSize), Publish
// calls in flight per worker (InFlight), publish time (PublishTimeout), lease
// time (LeaseTTL) and shutdown time (ShutdownTimeout) are bounded and
// configurable, with the defaults in the *Default constants.
//
// # Lifecycle
//
// [Relay.Start] starts the workers and returns; [Relay.Stop] stops taking
// new work, waits for the batches in hand to be acknowledged and settled,
// releases the leases and returns. Metrics go through a non-blocking
// [Hook], distributed tracing through Config.Tracer (a [PublishTracer];
// stores inject the writer's trace context with a [HeaderInjector]); logs
// through an injected *slog.Logger. Stores that implement
// [BacklogReader] measure their backlog for gauges with a bounded cost;
// publishers that implement [HealthChecker] say whether their broker is
// reachable.
package outbox
