// Package outbox implements the transactional outbox pattern: an
// application writes the messages it must send into its own database, in
// the same transaction as its state change, and a [Relay] drains them to a
// message broker.
//
// This package holds the portable parts and imports only the standard
// library: [Message], IDs ([NewID], UUIDv7), partitioning ([PartitionOf]),
// the capture contracts ([Store]: partitions shared by leases; [StreamStore]:
// a log held by one process at a time), the [Publisher] contract, and the
// [Relay] with its [Config].
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
// first published in their store order (Record.Seq), with any number of
// workers and relay processes, across retries and crashes. Keys map to P
// partitions ([PartitionOf], P fixed at migration); each partition has one
// owner at a time, a lease with an epoch held in the store. The owner
// publishes a partition's records in Seq order, never has two messages of
// one key in flight, so a later message cannot reach the broker before the
// earlier one is acknowledged, and holds back the later messages of a key
// whose earlier message failed. A relay starts a publish only while its
// lease will outlive [Config.PublishTimeout], and every settlement is
// fenced by the epoch: a relay that lost its lease cannot change the
// outbox. Leases are shared fairly among live relays; a relay hands its
// surplus back only once nothing of those partitions is in flight or
// waiting to be settled, so a relay joining does not cause duplicates. A
// relay leaving releases only the leases it holds, with their epochs.
// Messages without a key have no order.
//
// What stays in order is set by [Config.OrderScope]: by default
// ([OrderScopeTopic]) a key's messages to one topic, so that a key's
// messages to another topic go on while one destination is blocked or one
// of its messages fails; with [OrderScopeKey] a key's messages across every
// topic, for a consumer reading several topics as one ordered log (a
// JetStream stream over several subjects, a RabbitMQ queue bound to several
// routing keys), at the price that a blocked destination or a failing
// message then holds back the key's messages to every topic.
//
// Store order is commit order in these cases, and only in these:
//
//   - PostgreSQL, default write: Seq is drawn from a sequence when Write
//     inserts the row, so store order is insert order. It is commit order
//     when a key's writers are serialised before they call Write: they
//     update (or lock) the key's aggregate row first, or one writer at a
//     time writes the key. A transaction that writes first and locks after
//     (ORMs that flush inserts before updates) can commit after a later
//     writer of its key and still be published first.
//   - PostgreSQL with Options.KeyLocks (store URL ?key_locks=true): commit
//     order, whatever the application's lock order. Write takes a
//     transaction-scoped lock of each key before drawing Seq, so a second
//     writer of a key waits for the first to commit. The price: writers of
//     one key wait for each other's commit, and a transaction that locks
//     an application row before Write while another locks it after its
//     Write of the same key deadlocks with it (PostgreSQL aborts one with
//     SQLSTATE 40P01; retry it). README.md ("Commit order") gives its
//     measured cost and why it is not the default.
//   - SQLite: write transactions are serialised, so Seq order is commit
//     order ([CommitOrdered]).
//   - DynamoDB: Seq is the writer's clock when the item is built
//     (microseconds, strictly increasing within one Store), not a commit
//     order. A key's messages are published in that order when (1) the
//     writers of the key agree on the time to better than the interval
//     between two of its writes (one process with one Store always does),
//     and (2) each item reaches the relay's index within Options.FetchDelay
//     (1 s) of its Seq time by the relay's clock: the index (a global
//     secondary index, eventually consistent) lags, and the transaction
//     may commit after its Seq was taken. Fetch returns only items older
//     than FetchDelay; an item later than that (or below a cursor through
//     clock skew) is found by the periodic sweep ([Config.SweepInterval])
//     and published after the later messages of its key already out.
//   - PostgreSQL with the WAL capture (store/postgres, CaptureWAL): the
//     relay reads the messages from a logical replication slot, which
//     delivers transactions in commit order, so Seq is commit order for
//     every key, serialised or not, with no lock.
//
// A PostgreSQL row can commit after rows with a higher Seq were fetched.
// The relay's fetch returns such rows through a mark ([MarkedFetcher]: the
// previous fetch's snapshot), at most the fetch limit at a time, ahead of
// any later record of their key. Marks need the primary: a hot standby's
// snapshots do not show the primary's transactions in progress, so the
// relay refuses to start on one (postgres.ErrStandby). A periodic sweep
// below the cursors is the safety net for stores without marks.
//
// [OrderingNone] is the seeds' design: any worker claims any due records
// with FOR UPDATE SKIP LOCKED and holds the transaction across the broker
// call. No order. Its claims skip the destinations the relay has paused
// (blocked, no probe due), so a blocked backlog however large does not
// starve the others; a paused destination gets one probe message at a time.
//
// # Stopping
//
// Stop finishes the publishes in flight and writes their settlements. With
// a store that confirms settlements as a log position (a [StreamStore]:
// the WAL capture), a message settled past an unsettled one is not
// confirmed, and would be published again by the next reader; so the relay
// first publishes, in key order, the messages before the last settled one
// that can go at once, and only then leaves: a graceful stop republishes
// nothing that was acknowledged. It does not wait for a message's retry
// or a blocked destination: those messages and the ones published past
// them are published again (same IDs) by the next reader, and the store
// logs how many. Within ShutdownTimeout; past it, what is in hand is
// abandoned and Stop returns [ErrShutdownTimeout].
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
// its paused message (on its topic; on every topic with [OrderScopeKey]).
// However many keys wait for it, a paused destination keeps one message
// per partition in memory (its probe); its other keys leave memory and are
// read again, in order, once it works, so the partition goes on being
// read for its other destinations. A duplicate
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
// per failing key and one per paused destination, and at most
// 2 × FetchSize), Publish calls in flight per worker (InFlight),
// settlements not yet written per worker, counting the publishes in flight
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
// wrapping [ErrShutdownTimeout]. Metrics go through a non-blocking [Hook],
// distributed tracing through Config.Tracer (a [PublishTracer]; stores
// inject the writer's trace context with a [HeaderInjector]); logs through
// an injected *slog.Logger. Stores that implement [BacklogReader] measure
// their backlog for gauges with a bounded cost.
package outbox
