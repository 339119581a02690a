// Package bench is the engine of `outbox bench`: our relay and the seeds'
// algorithms, side by side, against the same PostgreSQL and the same broker.
//
// # Scenarios
//
// Drain scenarios write a backlog (--messages, untimed), then time how long
// it takes to empty it:
//
//   - seed-naive: the article's starting processor, faithfully. Its own
//     table outbox_messages (id uuid, type text, content jsonb,
//     occurred_on_utc, processed_on_utc, error) with no index but the primary
//     key; 1 worker; BEGIN; SELECT * … WHERE processed_on_utc IS NULL ORDER BY
//     occurred_on_utc LIMIT 1000; per row: Publish of that one message,
//     awaiting its confirmation, then UPDATE … SET processed_on_utc = now()
//     WHERE id = $1; COMMIT.
//   - seed-tuned: the article's final processor. The covering partial index
//     (occurred_on_utc, processed_on_utc) INCLUDE (id, type, content) WHERE
//     processed_on_utc IS NULL; SELECT id, type, content … FOR UPDATE SKIP
//     LOCKED; 5 workers; batch 1,000; one Publish of the whole batch (the
//     publisher pipelines it: concurrent publishes awaited together); one
//     UPDATE … FROM (VALUES …) per batch, as in the article; the transaction
//     is held across the broker call.
//   - relay/none, relay/key: ours, outbox.NewRelay on store/postgres and the
//     broker's publisher, ordering none or key, --workers and --batch.
//   - relay/wal: ours on the WAL capture (store/postgres CaptureWAL): the
//     backlog is emitted into the WAL (pg_logical_emit_message, untimed)
//     after the bench's slot was created; the relay reads the slot
//     (pgoutput), timed from Start until every message is published and
//     settled. The slot is dropped after each run, so that it retains no
//     WAL while other scenarios run. ceiling/wal is its ceiling/store: the
//     backlog captured from the slot and settled, no broker.
//   - writer/table-tx1, writer/wal-tx1, writer/table-tx10,
//     writer/wal-tx10: 8 producers alone (no relay) committing
//     transactions of 1 or 10 messages, as fast as they can, into the
//     table (INSERT … FROM unnest, with its NOTIFY) or into the WAL, up to
//     50,000 messages; transactions/s beside messages/s.
//   - scaling/w1, w2, w4, w8: relay/key with 1, 2, 4, 8 workers on 10,000
//     messages, next to the ADR's 850 / 1,650 / 3,200 / 5,800 events/s.
//   - ceiling/store: the same backlog drained by plain SELECT + DELETE in
//     batches on our schema, no broker. ceiling/broker: the same messages
//     published with confirmations in batches, no store. The combined
//     ceiling 1 / (1/store + 1/broker) is derived from the two.
//
// The relay, ceiling and writer scenarios also report the CPU time per
// message over the timed span: the bench's process (getrusage: producers
// or relay, and an embedded broker) and PostgreSQL's processes (the
// postmaster and its children, from /proc, when the server runs on this
// machine).
//
// The timed span of a drain starts right before the processor starts and
// ends when the outbox is empty: the published count is polled every 5 ms
// (memory), then the outbox is counted (one query) until it holds nothing.
// After every run the broker's stream must hold every message (nothing
// lost) and the outbox must be empty, or the run fails.
//
// Runs alternate: round r runs every selected scenario once, then round r+1
// (round-robin), so that drift of the machine spreads over all scenarios.
//
// Every scenario publishes through the outbox.Publisher that
// internal/backends opens for the --broker URL (seed-naive calls Publish
// with one message at a time, seed-tuned with its whole batch), to a
// destination of the bench's own: a JetStream stream (file storage,
// deduplication window on) created once per invocation and purged before
// every run; a RabbitMQ queue bound to the exchange, purged before every
// run; a Kafka topic created for every run. Without --broker, an embedded
// NATS server runs in the bench's process (so it shares its CPU).
//
// Our relay's hook events are summed per run (publish calls and their
// sizes, fetches, settles and their durations) to show where its time
// goes, and CPU profile samples are labelled scenario=<name> and
// phase=timed|untimed.
//
// With a dynamodb:// store only the DynamoDB scenarios run (the others
// are PostgreSQL-only), in tables of the bench's own (TABLE_bench_<random>
// and …_adr) dropped at the end:
//
//   - dynamodb/relay-key: our relay (ordering key) drains a backlog written
//     with BatchWriteItem (untimed; then the store's FetchDelay is waited
//     out, so the whole backlog is fetchable when the clock starts). The
//     relay's store counts its requests (dynamodb.Store.Stats); the
//     difference over the timed span, per operation, gives the requests
//     and capacity units per message relayed.
//   - dynamodb/outstanding: ADR 0034's case, once after the rounds:
//     store/dynamodb's outstanding-query comparison (registered with
//     internal/dynamobench) on an empty table of 20 shards
//     (5 topics: the older loop's 100 Queries against ScanConcurrency
//     Scans), then again after a backlog was written with BatchWriteItem.
//
// On RabbitMQ the bench's queue is a durable classic queue, or a quorum
// queue with Options.AMQPQueueType (--amqp-queue-type quorum).
//
// steady/wal is the steady scenario on the WAL capture (producers emit
// into the WAL, relay/wal reads the slot), at the same rate; both report
// the CPU time per message of the bench's process and of PostgreSQL over
// the measured time.
//
// The steady scenario runs once, after the rounds: producers write at a
// fixed rate (default half the relay/key median) in small transactions
// while relay/key runs, and the commit→broker-ack latency of every message
// is recorded. The commit time is taken when the producer's Commit
// returns; the ack time when the Publish call that carried the message
// returns with no error for it, measured by a wrapping publisher (the
// Publisher interface acknowledges a batch as a whole, so this is the time
// the relay itself learns of the acknowledgement).
package bench
