package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox/internal/backends"
)

// newDestinationsCommand is `outbox destinations create`: it creates on
// the broker what the relay publishes to (a NATS stream, Kafka topics, a
// RabbitMQ exchange, queue and bindings), so that a fresh broker does not
// leave every destination blocked.
func newDestinationsCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "destinations create --broker URL --topic TOPIC [...]",
		Short: "Create the streams, topics or queues the relay publishes to",
		Long: `destinations create makes the broker ready for the relay, which creates
nothing it publishes to unless given --create-destinations (a missing
destination blocks its messages: they wait, spending no attempts, and the
relay logs "destination blocked"). relay --create-destinations TOPICS does
at start what this command does, with the same settings:

  nats://, tls://   a JetStream stream (--stream, default OUTBOX) whose subjects
                    are the topics, or --stream-subjects; an existing stream
                    gets the subjects it lacks added
  kafka://          one topic per --topic, with --kafka-partitions and
                    --kafka-replication-factor (default: the brokers')
  amqp://, amqps:// the URL's exchange (?exchange=, default outbox), a durable
                    queue (--queue, default the exchange's name) bound with
                    each --topic as binding key (AMQP wildcards: orders.#)

Topics get --subject-prefix before them, as the relay publishes them. What
exists already is left as it is. The command takes the relay's broker
security flags (TLS, credentials).`,
		Example: `  outbox destinations create --broker nats://localhost:4222 --topic 'orders.>' --stream ORDERS --stream-replicas 3 --stream-max-age 168h
  outbox destinations create --broker kafka://localhost:9092 --topic orders.created --topic orders.paid --kafka-partitions 12 --kafka-replication-factor 3
  outbox destinations create --broker amqp://guest:guest@localhost:5672/ --topic 'orders.#' --queue orders --queue-type quorum`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown subcommand %q: use create", args[0])
			}
			return usagef("needs a subcommand: create (see %s --help)", cmd.CommandPath())
		},
	}
	cmd.AddCommand(newDestinationsCreateCommand(a))
	return cmd
}

func newDestinationsCreateCommand(a *app) *cobra.Command {
	var (
		broker, prefix string
		security       brokerSecurityFlags
		spec           backends.DestinationSpec
		asJSON         bool
		timeout        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create --broker URL --topic TOPIC [...]",
		Short: "Create the streams, topics or queues the relay publishes to (see outbox destinations --help)",
		Args:  cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&broker, "broker", "", "broker URL, such as "+brokerExample)
	fs.StringVar(&prefix, "subject-prefix", "", "the relay's --subject-prefix, put before every topic")
	fs.StringSliceVar(&spec.Topics, "topic", nil, "a topic the relay publishes (repeat or separate with commas; NATS wildcards * and > and AMQP # are allowed)")
	addDestinationSpecFlags(fs, &spec)
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of text")
	security.add(fs)
	timeoutFlag(fs, &timeout)
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if broker == "" {
			return usagef("--broker is required: give the broker URL, such as %s, or set %s", brokerExample, envName("broker"))
		}
		o := backends.BrokerOptions{SubjectPrefix: prefix, Logger: a.log}
		if err := security.apply(a, &o); err != nil {
			return err
		}
		ctx, cancel, err := a.withTimeout(ctx, timeout)
		if err != nil {
			return err
		}
		defer cancel()
		res, err := backends.CreateDestinations(ctx, broker, o, spec)
		if err != nil {
			if backends.IsConfigError(err) {
				return err
			}
			return fmt.Errorf("create destinations: %w", err)
		}
		if asJSON {
			enc := json.NewEncoder(a.env.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		}
		tw := tabwriter.NewWriter(a.env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tNAME\tACTION\tSETTINGS")
		for _, r := range res {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Kind, r.Name, r.Action, r.Detail)
		}
		return tw.Flush()
	})
	return cmd
}

// addDestinationSpecFlags adds the settings of what `destinations create`
// and `relay --create-destinations` create (all but the topics) to fs.
func addDestinationSpecFlags(fs *pflag.FlagSet, spec *backends.DestinationSpec) {
	fs.StringVar(&spec.Stream, "stream", "", "NATS: the stream's name (default "+backends.DestinationStreamDefault+")")
	fs.StringSliceVar(&spec.Subjects, "stream-subjects", nil, "NATS: the stream's subjects (default: the topics)")
	fs.StringVar(&spec.Retention, "stream-retention", "", "NATS: limits (default), interest or workqueue")
	fs.IntVar(&spec.Replicas, "stream-replicas", 0, "NATS: replicas of the stream (default 1; 3 on a cluster)")
	fs.DurationVar(&spec.DuplicateWindow, "stream-duplicate-window", 0, "NATS: how long the stream remembers message IDs to drop the relay's redeliveries (default 2m)")
	fs.StringVar(&spec.Storage, "stream-storage", "", "NATS: file (default) or memory")
	fs.DurationVar(&spec.MaxAge, "stream-max-age", 0, "NATS: drop messages older than this (0: keep until the stream's limits)")
	fs.IntVar(&spec.Partitions, "kafka-partitions", 0, "Kafka: partitions of each topic (0: the brokers' default)")
	fs.IntVar(&spec.ReplicationFactor, "kafka-replication-factor", 0, "Kafka: replication factor of each topic (0: the brokers' default)")
	fs.StringVar(&spec.Queue, "queue", "", "RabbitMQ: the queue bound to the exchange (default: the exchange's name)")
	fs.StringVar(&spec.QueueType, "queue-type", "", "RabbitMQ: classic (default) or quorum")
}

// createRelayDestinations is `relay --create-destinations`: before the
// relay opens its publisher, it creates what it publishes to as
// `outbox destinations create` does, and logs each thing created or found.
func (a *app) createRelayDestinations(ctx context.Context, broker string, o backends.BrokerOptions, spec backends.DestinationSpec) error {
	spec.TopicsFlag = a.flagRef("create-destinations")
	res, err := backends.CreateDestinations(ctx, broker, o, spec)
	if err != nil {
		if backends.IsConfigError(err) {
			return err
		}
		return fmt.Errorf("%s: %w", a.flagRef("create-destinations"), err)
	}
	for _, r := range res {
		a.log.Info("destination "+r.Action, "kind", r.Kind, "name", r.Name, "settings", r.Detail)
	}
	return nil
}
