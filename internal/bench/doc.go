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
//   - relay/none, relay/key: ours, as users run it: one `outbox relay`
//     process (the bench's own binary, os.Executable, re-executed with the
//     relay subcommand: --schema, --subject-prefix of the bench's
//     destination, --ordering none or key, --workers, --batch, --http-addr
//     on a free port; the store and broker URLs in OUTBOX_STORE and
//     OUTBOX_BROKER, and no other OUTBOX_* variable of the bench's
//     environment), timed from the process's start until
//     the outbox is empty. Its /metrics are read every 100 ms (every 10 ms
//     once 80% of the backlog is published; each scrape costs the relay a
//     little CPU) until outbox_published_total reaches the backlog, then
//     the outbox is counted in the database until it holds nothing; the
//     process is stopped with SIGTERM (untimed) and must exit 0. Its
//     fetches, publishes and settles come from the same /metrics.
//   - relays/1, relays/2, relays/3: 1, 2 or 3 `outbox relay` processes
//     (ordering key) draining one backlog, with each process's share of
//     the messages published (its /metrics); the ratio to relays/1 shows
//     whether more relays mean slower. The processes start on an empty
//     outbox and are waited for until they share the partitions; the
//     backlog is then committed in one transaction and the timing starts
//     at its commit: what N running relays cost, not N start-ups.
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
// # Database
//
// Without --store the bench starts a throwaway PostgreSQL from the local
// binaries, durable by default: fsync, synchronous_commit and
// full_page_writes on, as users run it; --fast-db starts it with fsync and
// full_page_writes off (the bench's figures before issue #12). Every table
// heading and every JSON object says which ("db": "durable", "fast", or
// "external" for a --store server, which runs as it is configured). The
// bench's own server loads pg_stat_statements (shared_preload_libraries);
// it is reset before every timed span and read after it: the top
// statements by total time (calls, total ms, rows, µs per message) are in
// every run's JSON ("statements", "statement_calls") and printed under
// each scenario with --statements. On a --store server they are not read
// (resetting a server's statistics is not the bench's business).
//
// # Processes and their CPU
//
// Every scenario reports the CPU time per message over its timed span, per
// process (RunResult.CPU, JSON "cpu_us_per_msg"):
//
//   - postgres: the postmaster and its children, when the server runs on
//     this machine: live backends from /proc/<pid>/schedstat (nanoseconds;
//     PostgreSQL's processes are single-threaded), backends that exited
//     during the span from the postmaster's children times
//     (/proc/<pid>/stat cutime + cstime);
//   - broker: the broker process the bench started (/proc/<pid>/stat);
//     "-" with an external --broker, whose CPU the bench cannot see;
//   - relay: the `outbox relay` process(es) (/proc/<pid>/stat) for
//     relay/none, relay/key, relays/N, scaling, steady and idle; for the
//     scenarios that run their processor inside the bench's process (the
//     seeds, ceiling/store, ceiling/broker, ceiling/wal, relay/wal) the
//     bench's process (getrusage), which then only does that;
//   - producers: the bench's process (getrusage) while its producers write
//     (the writer and steady scenarios; in steady it also runs the
//     subscriber that timestamps each received message).
//
// In relay/none, relay/key and relays/N the bench's process only waits
// (its scrapes and the final count are in the statements, not in any CPU
// column).
//
// # Broker
//
// Without --broker the bench starts its broker as a process of its own:
// the nats-server binary on PATH (Options.BrokerProcess BrokerNATSServer,
// the default: Debian's package, as users run it), with a configuration
// file that sets only its address and a JetStream store directory in a
// temporary directory (file storage, the server's default sync), or, with
// BrokerEmbedded, its binary re-executed as `outbox bench broker-process`
// (hidden), which runs the nats-server module it embeds with JetStream
// file storage in a temporary directory and prints its client URL. The
// steady/ORDERING@RATE scenarios receive every message with a JetStream
// consumer on a connection of their own (durable, explicit acks, or
// ordered: Options.SteadyConsumer) and, beside it, with a core
// subscription on the stream's subjects (commit→routed: before the stream
// stores the message). With --broker nats://… the bench
// uses that server instead: the broker's CPU is then not measured (it may
// run elsewhere), and the figures compare with the embedded broker's as
// one nats-server with file storage against another (version, storage
// directory and machine permitting). Brokers are opened through
// internal/backends (the registry); the broker-specific part of the bench
// (the destination it creates, empties and counts: a stream, a queue, a
// topic) is one brokerSetup per scheme in brokerSetups, so adding a broker
// touches that one place; a scheme registered in internal/backends but not
// there runs without resets or counts.
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
// internal/backends opens for the broker URL (seed-naive calls Publish
// with one message at a time, seed-tuned with its whole batch; the relay
// processes open theirs from the same URL and prefix), to a destination of
// the bench's own: a JetStream stream (file storage, deduplication window
// on) created anew before every run; a RabbitMQ queue bound to the
// exchange, purged before every run; a Kafka topic created for every run.
//
// Our relay's fetches, publish calls and settles (counts and summed
// durations, from its /metrics histograms) show where its time goes, and
// CPU profile samples of the bench's process are labelled
// scenario=<name> and phase=timed|untimed.
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
// # Steady load and idle
//
// The steady/ORDERING@RATE scenarios (steady/key@1000, steady/none@1000,
// steady/key@5000, steady/none@5000) and idle run once, after the rounds.
// A steady scenario first runs the producers alone: 8 goroutines of the
// bench's process commit SteadyPerTx (10) messages per transaction at the
// offered rate, open loop, for --steady-warmup and then --steady-duration,
// the latter measured (PostgreSQL's and the producers' CPU, the
// statements); the outbox is emptied. Then one `outbox relay` process
// (ordering ORDERING) is started and waited for (its /metrics served and,
// in key mode, leases held), the bench subscribes to its destination, and
// the producers run again the same way. Reported: the rate the producers
// achieved with the relay and alone, each process's CPU over the measured
// span as a share of a core and per message, the PostgreSQL CPU per
// message the relay adds (with the relay minus alone, per second, divided
// by the achieved rate) next to the producers' own, the relay's statements
// per second (every statement's calls with the relay minus those with the
// producers alone, from pg_stat_statements), and the commit→receive
// latency: from the producer's Commit returning to the bench's core NATS
// subscription on the stream's subjects receiving the message (the relay
// runs in another process, so the old commit→ack, taken when the relay's
// Publish call returned, cannot be observed; the subscriber receives a
// message as the server routes it, at most one stream write before the
// relay's acknowledgement). Only NATS has the subscriber; on other
// brokers the steady scenarios fail with an error saying so. Every
// message must arrive and the outbox must end empty.
//
// After the relay's phase of steady/key@RATE comes ceiling/steady@RATE,
// shown as a row of its own: the outbox emptied and the stream reset, the
// process `outbox bench steady-ceiling` (RunSteadyCeiling: LISTEN, one
// SELECT and one Publish per notification, one DELETE per 100 ms, nothing
// else) instead of the relay, the producers run the same way, and the same
// figures are taken against the same producers-alone baseline. The steady
// targets at RATE (of key and of none) print the ratio to it, and a bound
// the ceiling itself misses as out of reach here.
//
// horizon/free@2000 and horizon/held@2000 are steady/key@2000; the held
// one opens, once the relay is ready, a transaction on a connection of its
// own that takes a transaction ID and stays idle in transaction until
// every message was received, as a forgotten application session would:
// vacuum can then remove none of the rows the relay deletes. They are
// shown side by side with the held run's ratios, the relay's mean fetch
// and settle times and the outbox table's dead tuples at the end.
//
// idle runs one `outbox relay` process (ordering key) on an empty outbox
// for --idle-duration (20 s) after it is ready: its CPU and PostgreSQL's
// as a share of a core, and the statements per second (every statement
// PostgreSQL ran: nothing else runs).
//
// steady/wal is the older steady scenario, kept on the WAL capture with
// the relay inside the bench's process (the bench creates the slot the
// relay reads): producers emit into the WAL at --steady-rate (1,000 by
// default, next to steady/key@1000) in transactions of ceil(rate / 1,000)
// messages, and the commit→broker-ack latency of every message is
// recorded: the ack time is when the Publish call that carried the
// message returns with no error for it, measured by a wrapping publisher.
package bench
