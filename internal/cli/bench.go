//go:build !outbox_slim

package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/bench"
	"github.com/outboxrelay/outbox/internal/servers"
)

func newBenchCommand(a *app) *cobra.Command {
	var (
		o          bench.Options
		asJSON     bool
		statements bool
		plotFile   string
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark the relay against the seeds' algorithms, side by side",
		Long: `bench runs, in one invocation and against the same PostgreSQL and broker:
  seed-naive      the article's starting processor (no index, one publish and one UPDATE per message)
  seed-tuned      the article's final processor (covering index, SKIP LOCKED, 5 workers, batch publish, UPDATE … FROM VALUES)
  relay/none      our relay, ordering none (SKIP LOCKED claims): one outbox relay process
  relay/key       our relay, ordering key (partition leases, per-key order): one outbox relay process
  relay/wal       our relay reading the WAL (capture wal: a logical replication slot), in the bench's process
  ceiling/store   the backlog drained by plain SELECT + DELETE, no broker
  ceiling/wal     the backlog captured from the WAL (a logical slot) and settled, no broker
  ceiling/broker  the same messages published with confirmations, no store
  scaling/w1…w8   relay/key with 1, 2, 4, 8 workers on 10,000 messages, next to the ADR's figures
  relays/1…3      1, 2, 3 outbox relay processes (ordering key) draining one backlog
                  committed once they run and share the partitions (timed from its commit)
  writer/table-tx1, writer/wal-tx1, writer/table-tx10, writer/wal-tx10
                  8 producers alone writing transactions of 1 or 10 messages
                  into the table or into the WAL (50,000 messages at most)
  steady/key@1000, steady/none@1000, steady/key@5000, steady/none@5000
                  producers committing 10 messages per transaction at the
                  rate, first alone, then with one outbox relay process:
                  commit→receive latency, CPU per process, the PostgreSQL
                  CPU and statements the relay adds; after steady/key@RATE
                  comes ceiling/steady@RATE: the same load relayed by the
                  bare minimum (LISTEN, SELECT, publish, DELETE) in a
                  process of its own, the floor the targets are held to
  horizon/free@2000, horizon/held@2000
                  steady/key@2000 without, then with one idle transaction
                  holding a transaction ID (the xmin horizon) through the
                  run with the relay: latency, PostgreSQL CPU per message,
                  dead tuples at the end, side by side
  idle            one outbox relay process with nothing to do (--idle-duration)
  steady/wal      producers emitting into the WAL at --steady-rate while relay/wal runs: commit→ack
Drain scenarios run --runs times each, alternating (round-robin). The table
shows the median, min–max, the ratio to seed-tuned, the CPU µs per message
of each process (PostgreSQL, the broker, the relay; the producers where
they run) and the sources' published figures, then issue #12's targets
with ✓/✗. The relay runs as the real outbox relay process (this binary,
re-executed), so that its CPU is its own.

Without --store a throwaway PostgreSQL server is started from the local
binaries: durable (fsync, synchronous_commit and full_page_writes on), or
with --fast-db fsync and full_page_writes off; pg_stat_statements is
loaded, and each run's top statements are read (--statements prints them;
--json always has them). Every table says which database it ran on.
Without --broker the bench starts its broker as a process of its own (the
nats-server binary on PATH with its defaults and JetStream file storage,
or with --broker-process embedded this binary, re-executed: the NATS
server it embeds), so that its CPU is measured apart; with --broker
nats://… it uses that server and cannot measure its CPU. The steady
scenarios receive with a durable JetStream consumer (--steady-consumer). With --store the bench works in schemas of its
own (outbox_bench_*), dropped at the end.

With --store dynamodb://TABLE?endpoint=…&region=… only the DynamoDB scenarios
run (the ones above are PostgreSQL-only; selecting one is a usage error):
  dynamodb/relay-key    our relay (ordering key, --workers, --batch) drains a
                        prefilled backlog; msgs/s, and DynamoDB requests and
                        capacity units per message relayed, per operation
  dynamodb/outstanding  ADR 0034's case: find the outstanding messages of
                        5 topics × 20 shards the older way (a Query per topic
                        and shard: 100 requests) and ours (a parallel Scan of
                        scan_concurrency segments), on an empty outbox and on
                        a backlog of 10,000 (or --messages if smaller)
The backlog defaults to 10,000 with DynamoDB (dynalite is slow): set
--messages for another. The bench creates tables TABLE_bench_<random> and
TABLE_bench_<random>_adr, and drops them at the end.

On RabbitMQ (--broker amqp://…) the bench declares a durable queue of its own
bound to the exchange: classic by default, a quorum queue with
--amqp-queue-type quorum. The steady scenarios need NATS (they subscribe to
the stream to time each message's arrival).`,
		Example: `  outbox bench
  outbox bench --scenarios 'relay/*' --messages 50000 --runs 1
  outbox bench --scenarios 'relay/key,relay/none,seed-tuned,ceiling/*' --statements
  outbox bench --scenarios 'steady/*,idle,relays/*' --runs 1
  outbox bench --fast-db --scenarios 'relay/*'
  outbox bench --store postgres://postgres@localhost:5432/bench --broker nats://localhost:4222 --json
  outbox bench --store 'dynamodb://bench?endpoint=http://127.0.0.1:8000&region=us-east-1' --runs 1
  outbox bench --broker amqp://guest:guest@localhost:5672/ --amqp-queue-type quorum --scenarios 'relay/*'`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Store, "store", "", "postgres:// URL of a database the bench may create schemas in, or dynamodb://TABLE?endpoint=…&region=… (default: a throwaway PostgreSQL server)")
	fs.StringVar(&o.Broker, "broker", "", "broker URL, such as "+brokerExample+" (default: a nats-server process, see --broker-process)")
	fs.StringVar(&o.AMQPQueueType, "amqp-queue-type", bench.AMQPClassic, "type of the bench's queue on an amqp:// broker: classic or quorum")
	fs.IntVar(&o.Messages, "messages", bench.MessagesDefault, fmt.Sprintf("backlog of each drain scenario (%d with a dynamodb:// store unless given)", bench.DynamoMessagesDefault))
	fs.IntVar(&o.Payload, "payload", bench.PayloadDefault, "payload size in bytes (a JSON document)")
	fs.IntVar(&o.Keys, "keys", bench.KeysDefault, "distinct message keys")
	fs.IntVar(&o.Batch, "batch", outbox.BatchSizeDefault, "our relay's batch size (the seeds use the article's 1,000)")
	fs.IntVar(&o.Workers, "workers", outbox.WorkersDefault, "our relay's workers (the seeds use the article's 1 and 5)")
	fs.StringSliceVar(&o.Scenarios, "scenarios", nil, "scenarios to run: names or patterns, comma-separated, such as 'relay/*,seed-tuned' (default: all)")
	fs.IntVar(&o.Runs, "runs", bench.RunsDefault, "runs of each drain scenario")
	fs.IntVar(&o.SteadyRate, "steady-rate", bench.SteadyRateDefault, "steady/wal's messages per second (the steady/ORDERING@RATE scenarios carry their rates in their names)")
	fs.DurationVar(&o.SteadyDuration, "steady-duration", bench.SteadyDurationDefault, "how long the steady scenario produces and measures")
	fs.DurationVar(&o.SteadyWarmup, "steady-warmup", bench.SteadyWarmupDefault, "how long the steady scenario produces before it measures (0: no warm-up)")
	fs.DurationVar(&o.SteadyAloneDuration, "steady-alone-duration", 0, "how long the steady and horizon scenarios measure the producers alone, the baseline of the PostgreSQL CPU the relay adds (0: as long as --steady-duration)")
	fs.StringVar(&o.Layout, "layout", bench.LayoutPlain, "layout of our outbox table: plain, or ring (partitions truncated once drained: no dead tuples left for vacuum)")
	fs.BoolVar(&o.FastDB, "fast-db", false, "start the throwaway PostgreSQL with fsync=off and full_page_writes=off (default: durable, fsync=on, synchronous_commit=on, full_page_writes=on); not with --store")
	fs.DurationVar(&o.IdleDuration, "idle-duration", bench.IdleDurationDefault, "how long the idle scenario measures a relay with nothing to do")
	fs.BoolVar(&statements, "statements", false, "print each scenario's top statements by total time (pg_stat_statements over the timed span; on the bench's own server; --json always has them)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object per scenario instead of the table")
	fs.StringVar(&plotFile, "plot", "", "also draw throughput per scenario and the workers scaling curve into this SVG file")
	fs.StringVar(&o.BrokerProcess, "broker-process", bench.BrokerNATSServer, "the broker process started without --broker: nats-server (the binary on PATH) or embedded (the NATS server this binary embeds)")
	fs.StringVar(&o.SteadyConsumer, "steady-consumer", bench.ConsumerDurable, "the JetStream consumer the steady/ORDERING@RATE scenarios receive with: durable (pull, explicit acks) or ordered (ephemeral)")
	fs.StringVar(&o.RelayProfile, "relay-cpuprofile", "", "run the steady/ORDERING@RATE scenarios' relay with --pprof and write its CPU profile over the measured span to PREFIX-SCENARIO.pprof (and the ceiling/steady@RATE process's, its whole run, to PREFIX-ceiling-steady-RATE.pprof)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file; samples are labelled scenario=NAME and phase=timed|untimed (go tool pprof -top -tagfocus=phase=timed FILE)")

	cmd.AddCommand(newBenchBrokerCommand(a))
	cmd.AddCommand(newBenchCeilingCommand(a))
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		o.Logger = a.log
		o.Notices = a.env.Stderr
		if err := a.checkBench(o); err != nil {
			return err
		}
		if bench.IsDynamoDB(o.Store) && !cmd.Flags().Changed("messages") {
			o.Messages = 0 // Run picks DynamoMessagesDefault and says so
		}
		stopProfile, err := a.startCPUProfile(cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
		progress := a.env.IsTerminal(a.env.Stderr)
		if progress {
			o.Progress = func(p bench.Progress) {
				fmt.Fprintf(a.env.Stderr, "\r\033[K%s run %d/%d: %s %d/%d (%s)", p.Scenario, p.Round, p.Rounds, p.Phase, p.Done, p.Total, p.Elapsed.Round(time.Second))
			}
		}
		rep, err := bench.Run(ctx, o)
		if progress {
			fmt.Fprint(a.env.Stderr, "\r\033[K")
		}
		if rep == nil {
			var oe *bench.OptionError
			if errors.As(err, &oe) {
				return usagef("%s %s", a.flagRef(oe.Flag), oe.Msg)
			}
			return err
		}
		rep.ShowStatements = statements
		if asJSON {
			if werr := rep.WriteJSON(a.env.Stdout); werr != nil {
				return werr
			}
		} else if werr := rep.WriteTable(a.env.Stdout); werr != nil {
			return werr
		}
		if plotFile != "" {
			if perr := rep.WritePlot(plotFile); perr != nil {
				return perr
			}
		}
		return err
	})
	return cmd
}

// newBenchBrokerCommand is the broker process `outbox bench` starts when
// no --broker is given (hidden: the bench runs it from its own binary): the
// embedded NATS server with JetStream file storage in a temporary
// directory, its client URL printed on one line of stdout, serving until
// SIGINT or SIGTERM.
func newBenchBrokerCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:    bench.BrokerCommand[1],
		Short:  "Run the bench's broker process (an embedded NATS server, JetStream file storage)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			srv, stop, err := servers.StartNATS("")
			if err != nil {
				return err
			}
			defer stop()
			fmt.Fprintln(a.env.Stdout, srv.ClientURL())
			<-ctx.Done()
			return nil
		}),
	}
}

// checkBench checks the bench flags before anything starts.
func (a *app) checkBench(o bench.Options) error {
	// The flags default to non-zero values: a zero given on the command
	// line is a mistake, not a request for the default.
	v := o.WithDefaults()
	v.Messages, v.Payload, v.Keys, v.Batch, v.Workers, v.Runs = o.Messages, o.Payload, o.Keys, o.Batch, o.Workers, o.Runs
	v.SteadyDuration, v.IdleDuration, v.SteadyRate = o.SteadyDuration, o.IdleDuration, o.SteadyRate
	if err := v.Validate(); err != nil {
		var oe *bench.OptionError
		if errors.As(err, &oe) {
			return usagef("%s %s", a.flagRef(oe.Flag), oe.Msg)
		}
		return usagef("%v", err)
	}
	if o.Store != "" {
		if err := backends.CheckStoreURL(o.Store, backends.StoreOptions{}); err != nil {
			return err
		}
		if s := storeScheme(o.Store); s != "postgres" && s != "postgresql" && s != "dynamodb" && s != "mysql" {
			return usagef("%s: the bench runs on postgres://, mysql:// or dynamodb:// (or, with no --store, a throwaway PostgreSQL); got a %s URL", a.flagRef("store"), s)
		}
	}
	if o.Broker != "" {
		if err := backends.CheckBrokerURL(o.Broker, backends.BrokerOptions{}); err != nil {
			return err
		}
	}
	return nil
}
