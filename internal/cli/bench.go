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
)

func newBenchCommand(a *app) *cobra.Command {
	var (
		o          bench.Options
		asJSON     bool
		plotFile   string
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark the relay against the seeds' algorithms, side by side",
		Long: `bench runs, in one invocation and against the same PostgreSQL and broker:
  seed-naive      the article's starting processor (no index, one publish and one UPDATE per message)
  seed-tuned      the article's final processor (covering index, SKIP LOCKED, 5 workers, batch publish, UPDATE … FROM VALUES)
  relay/none      our relay, ordering none (SKIP LOCKED claims)
  relay/key       our relay, ordering key (partition leases, per-key order)
  relay/wal       our relay reading the WAL (capture wal: a logical replication slot)
  ceiling/store   the backlog drained by plain SELECT + DELETE, no broker
  ceiling/wal     the backlog captured from the WAL (a logical slot) and settled, no broker
  ceiling/broker  the same messages published with confirmations, no store
  scaling/w1…w8   relay/key with 1, 2, 4, 8 workers on 10,000 messages, next to the ADR's figures
  writer/table-tx1, writer/wal-tx1, writer/table-tx10, writer/wal-tx10
                  8 producers alone writing transactions of 1 or 10 messages
                  into the table or into the WAL (50,000 messages at most)
  steady          producers at a fixed rate while relay/key runs: commit→ack latency
  steady/wal      the same with the WAL capture: producers emit into the WAL, relay/wal runs
Drain scenarios run --runs times each, alternating (round-robin). The table
shows the median, min–max, the ratio to seed-tuned and the sources' published
figures, then the issue's targets with ✓/✗.

Without --store a throwaway PostgreSQL server is started from the local
binaries; without --broker an embedded NATS server (JetStream, file storage).
With --store the bench works in schemas of its own (outbox_bench_*), dropped
at the end.

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
--amqp-queue-type quorum.`,
		Example: `  outbox bench
  outbox bench --scenarios 'relay/*' --messages 50000 --runs 1
  outbox bench --store postgres://postgres@localhost:5432/bench --broker nats://localhost:4222 --json
  outbox bench --store 'dynamodb://bench?endpoint=http://127.0.0.1:8000&region=us-east-1' --runs 1
  outbox bench --broker amqp://guest:guest@localhost:5672/ --amqp-queue-type quorum --scenarios 'relay/*'`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Store, "store", "", "postgres:// URL of a database the bench may create schemas in, or dynamodb://TABLE?endpoint=…&region=… (default: a throwaway PostgreSQL server)")
	fs.StringVar(&o.Broker, "broker", "", "broker URL, such as "+brokerExample+" (default: an embedded NATS server)")
	fs.StringVar(&o.AMQPQueueType, "amqp-queue-type", bench.AMQPClassic, "type of the bench's queue on an amqp:// broker: classic or quorum")
	fs.IntVar(&o.Messages, "messages", bench.MessagesDefault, fmt.Sprintf("backlog of each drain scenario (%d with a dynamodb:// store unless given)", bench.DynamoMessagesDefault))
	fs.IntVar(&o.Payload, "payload", bench.PayloadDefault, "payload size in bytes (a JSON document)")
	fs.IntVar(&o.Keys, "keys", bench.KeysDefault, "distinct message keys")
	fs.IntVar(&o.Batch, "batch", outbox.BatchSizeDefault, "our relay's batch size (the seeds use the article's 1,000)")
	fs.IntVar(&o.Workers, "workers", outbox.WorkersDefault, "our relay's workers (the seeds use the article's 1 and 5)")
	fs.StringSliceVar(&o.Scenarios, "scenarios", nil, "scenarios to run: names or patterns, comma-separated, such as 'relay/*,seed-tuned' (default: all)")
	fs.IntVar(&o.Runs, "runs", bench.RunsDefault, "runs of each drain scenario")
	fs.IntVar(&o.SteadyRate, "steady-rate", 0, "steady scenario's messages per second (0: half the measured relay/key rate)")
	fs.DurationVar(&o.SteadyDuration, "steady-duration", bench.SteadyDurationDefault, "how long the steady scenario produces and measures")
	fs.DurationVar(&o.SteadyWarmup, "steady-warmup", bench.SteadyWarmupDefault, "how long the steady scenario produces before it measures (0: no warm-up)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object per scenario instead of the table")
	fs.StringVar(&plotFile, "plot", "", "also draw throughput per scenario and the workers scaling curve into this SVG file")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file; samples are labelled scenario=NAME and phase=timed|untimed (go tool pprof -top -tagfocus=phase=timed FILE)")

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

// checkBench checks the bench flags before anything starts.
func (a *app) checkBench(o bench.Options) error {
	// The flags default to non-zero values: a zero given on the command
	// line is a mistake, not a request for the default.
	v := o.WithDefaults()
	v.Messages, v.Payload, v.Keys, v.Batch, v.Workers, v.Runs = o.Messages, o.Payload, o.Keys, o.Batch, o.Workers, o.Runs
	v.SteadyDuration = o.SteadyDuration
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
		if s := storeScheme(o.Store); s != "postgres" && s != "postgresql" && s != "dynamodb" {
			return usagef("%s: the bench runs on postgres:// or dynamodb:// (or, with no --store, a throwaway PostgreSQL); got a %s URL", a.flagRef("store"), s)
		}
	}
	if o.Broker != "" {
		if err := backends.CheckBrokerURL(o.Broker, backends.BrokerOptions{}); err != nil {
			return err
		}
	}
	return nil
}
