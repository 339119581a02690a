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
// marks. PostgreSQL's WAL capture (store/postgres, CaptureWAL) reads the
// messages from a logical replication slot in commit order, so its Seq is
// commit order for every key, serialised or not. Messages without a key
// have no order.
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
// error and attempt count. It holds back only later messages of its own key,
// however many are waiting: while it fails, its key keeps only that message
// in memory, the rest of the key stays in the store, and the partition goes
// on being read for its other keys; when the message is delivered or its
// dead-lettering is written, the relay reads the key's waiting messages
// again, in order. A stored row the relay cannot decode (headers that are
// not a map of strings, written by another producer or by hand) is
// dead-lettered alone, without being published, with an error that says
// what is wrong with it ([Record.DecodeError]).
//
// # Failures have kinds
//
// Publishers classify each failure ([PermanentError], [BlockedError],
// anything else retryable). A blocked destination (no stream or topic, not
// authorised, unroutable, full, broker unreachable, an outcome the
// publisher cannot know) is not the message's fault: the relay spends no
// attempt and dead-letters nothing; it pauses that destination, probes it
// with one message at a time relay-wide, with backoff from 100 ms to 5 s,
// keeps publishing other destinations, and reports it ([Relay.Blocked],
// [EventBlocked], a WARN line every 30 s). Messages of a key wait behind
// its paused message whatever their own destination. A duplicate
// acknowledgement ([ErrDuplicate]) counts as delivered and is reported.
// With Config.OnPermanent = [PermanentHoldKey], a permanent failure holds
// its key instead of being dead-lettered. A relay whose publisher
// ([HealthChecker]) cannot reach the broker for Config.LeaseTTL stops
// heartbeating and hands every partition back, so relays that can publish
// take them over; it takes its share again once the broker answers.
//
// # Bounded everything
//
// Batch size, records held in memory per partition (FetchSize, plus one
// per failing or paused key, and at most 2 × FetchSize), Publish calls in
// flight per worker (InFlight), settlements not yet written per worker
// (2 × BatchSize × InFlight: while the store refuses settles, the worker
// stops starting publishes, so a crash then can publish again at most that
// many), publish time (PublishTimeout, counted from when the batch was
// built and never past the lease), lease time (LeaseTTL), every fetch
// (its limit holds for late commits too) and shutdown time
// (ShutdownTimeout) are bounded and configurable, with the defaults in the
// *Default constants. Late commits that a store without marks (DynamoDB)
// leaves below a cursor are found by a sweep that runs every
// Config.SweepInterval (1 s by default) beside the publishing, whatever the
// load: within SweepInterval plus two store round trips.
//
// # Lifecycle
//
// [Relay.Start] starts the workers and returns; [Relay.Stop] stops taking
// new work, waits for the batches in hand to be acknowledged and settled,
// releases the leases and returns; if Config.ShutdownTimeout passed first
// it abandons the rest (it stays in the outbox) and returns an error
// wrapping [ErrShutdownTimeout]. Metrics and tracing go through a
// non-blocking [Hook]; logs through an injected *slog.Logger.
package outbox
